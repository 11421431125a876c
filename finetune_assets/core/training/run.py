"""``train(config)``: what torchrun workers, the CLI and tests call (thin, like llm-foundry's)."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
import warnings
from typing import Any

import fsspec
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import LearningRateMonitor
from pytorch_lightning.loggers import MLFlowLogger
from transformers import AutoTokenizer

from finetune_assets.core.io.contracts import TRAINING_RESULT_FILE, TrainingResult
from finetune_assets.core.labels.infer import LabelSet
from finetune_assets.core.training import device_settings
from finetune_assets.core.training.callbacks import BoundaryCheckpoint, Progress, Throughput
from finetune_assets.core.training.checkpoints import fencing
from finetune_assets.core.training.checkpoints import trainer_files as files
from finetune_assets.core.training.checkpoints.best import BEST, BEST_DIR, BestModel
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.data import sharding
from finetune_assets.core.training.data.datamodule import MdsDataModule, balanced_class_weights
from finetune_assets.core.training.data.sharding import ShardedStrategy, local_parameters
from finetune_assets.core.training.device_settings import ddp_strategy, on_gpu
from finetune_assets.core.training.export import HuggingFaceCheckpointer, trainer_tracking_uri
from finetune_assets.core.training.module import ReviewClassifier, load_classifier
from finetune_assets.core.training.precision import resolve_precision
from finetune_assets.core.training.process_group import (
    gather,
    init_process_group,
    per_node,
    torchrun_world,
)
from finetune_assets.core.tuning import pruning

log = logging.getLogger("finetune_assets.core.training")

LAST = "last.ckpt"
# beside the checkpoints: a resumed run keeps logging into the same MLflow run
MLFLOW_RUN_FILE = "mlflow_run.json"


class _DropLitLoggerTip(logging.Filter):
    """Lightning advertises its cloud logger on every Trainer; this run logs to MLflow."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "try installing [litlogger]" not in record.getMessage()


def quiet_known_notices() -> None:
    """Silence the trainer's known, harmless library notices where they arise; all else stays.

    Each filter names the message, the category and the module that warns (not a blanket ignore).
    """
    # Lightning 2.6's own pytree helper uses the LeafSpec class torch deprecated (not our code).
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"pytorch_lightning\.utilities\._pytree",
    )
    # StreamingDataset partitions samples per rank and worker itself: its __len__ is exact per rank.
    warnings.filterwarnings(
        "ignore",
        message=r"Your `IterableDataset` has `__len__` defined",
        category=UserWarning,
        module=r"pytorch_lightning\.utilities\.data",
    )
    # A resumed run's best-checkpoint folder (core/training/checkpoints/best.py) holds the best so
    # far, by design.
    warnings.filterwarnings(
        "ignore",
        message=r"Checkpoint directory .*[/\\]best exists and is not empty",
        category=UserWarning,
        module=r"pytorch_lightning\.callbacks\.model_checkpoint",
    )
    tips = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    if not any(isinstance(f, _DropLitLoggerTip) for f in tips.filters):
        tips.addFilter(_DropLitLoggerTip())


# "auto" shards models above this many parameters: below it DDP's one all-reduce per step beats
# FSDP's per-block all-gathers, and a replica (weights, grads, Adam: 16 bytes/parameter) fits a GPU.
FSDP_ABOVE_PARAMETERS = 1_000_000_000


def _strategy(config: TrainerConfig, world: int, local_world: int, parameters: int = 0) -> Any:
    strategy = config.strategy
    if strategy == "auto":
        strategy = "fsdp" if parameters > FSDP_ABOVE_PARAMETERS and world > 1 else "ddp"
    if strategy == "fsdp":
        return ShardedStrategy(
            num_nodes=max(1, world // local_world),
            ranks_per_node=local_world,
            sharded_checkpoints=config.checkpoint_format == "sharded",
        )
    if config.checkpoint_format == "sharded":
        log.warning("checkpoint_format 'sharded' needs FSDP; strategy %s writes full", strategy)
    return "auto" if world == 1 else ddp_strategy(config.precision, on_gpu(config.accelerator))


def checkpoint_io(config: TrainerConfig) -> Any:
    """Atomic writes; on a GPU in a background thread (Lightning's ``AsyncCheckpointIO`` copies the
    state on the device first, then training goes on while rank 0 writes). On CPU the copy and the
    writer would compete with training for the same cores: written in place, as before.
    """
    atomic = files.AtomicCheckpointIO(fence_dir=config.checkpoint_dir)
    if config.accelerator != "cpu" and torch.cuda.is_available():
        from pytorch_lightning.plugins.io import AsyncCheckpointIO

        return AsyncCheckpointIO(atomic)
    return atomic


def _trainer(
    config: TrainerConfig,
    logger: MLFlowLogger | bool,
    extra_callbacks: list[pl.Callback],
    validate: bool = True,
    parameters: int = 0,
) -> pl.Trainer:
    _, world, local_world = torchrun_world()
    strategy = _strategy(config, world, local_world, parameters)
    minutes = config.checkpoint_every_minutes
    # Only after an optimizer step; on a time interval rank 0's decision is broadcast (no rank
    # skips a save), checked at the log interval only.
    checkpoint = BoundaryCheckpoint(
        dirpath=files.local_path(config.checkpoint_dir),
        filename="step-{step}",
        every_n_train_steps=config.checkpoint_every_n_steps,
        train_time_interval=datetime.timedelta(minutes=minutes) if minutes else None,
        time_check_every_n_steps=config.log_every_n_steps,
        save_top_k=0,
        save_last=True,
    )
    callbacks: list[pl.Callback] = [checkpoint, *extra_callbacks]
    if logger:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    return pl.Trainer(
        accelerator=config.accelerator,
        devices=local_world,
        num_nodes=max(1, world // local_world),
        strategy=strategy,
        precision=config.precision if config.precision != "32" else "32-true",
        max_epochs=config.epochs,
        max_steps=config.max_steps,
        accumulate_grad_batches=config.accumulate_grad_batches,
        gradient_clip_val=config.gradient_clip_val,
        log_every_n_steps=config.log_every_n_steps,
        **pruning.validation_schedule(config),  # once per epoch; more often in a tuning trial
        num_sanity_val_steps=0,
        use_distributed_sampler=False,  # StreamingDataset partitions samples across ranks itself
        limit_train_batches=config.limit_train_batches,
        limit_val_batches=config.limit_val_batches
        if validate
        else 0,  # 0: Lightning never builds the loader
        limit_test_batches=config.limit_test_batches,
        logger=logger,
        callbacks=callbacks,
        plugins=[checkpoint_io(config)],
        enable_progress_bar=False,
        default_root_dir=files.local_path(config.checkpoint_dir),
    )


def _mlflow_logger(config: TrainerConfig, rank: int) -> MLFlowLogger | None:
    if rank != 0:
        return None
    m = config.mlflow
    run_file = files.local_path(config.checkpoint_dir) + "/" + MLFLOW_RUN_FILE
    run_id = None
    if files.exists(run_file) and files.exists(
        files.local_path(config.checkpoint_dir) + "/" + LAST
    ):
        run_id = files.read_json(run_file).get("run_id")
    logger = MLFlowLogger(
        experiment_name=m.experiment_name,
        run_name=m.run_name,
        tracking_uri=trainer_tracking_uri(config),
        tags=dict(m.tags) or None,
        artifact_location=m.artifact_location,
        run_id=run_id,
        # metrics are queued and sent by mlflow's thread; finalize() flushes the queue
        synchronous=False,
    )
    files.write_json_atomic(
        run_file, {"run_id": logger.run_id, "experiment_id": logger.experiment_id}
    )
    logger.log_hyperparams(config.hparams())
    return logger


def _local_resume(resume: str | None) -> str | None:
    """The checkpoint to hand Lightning: a node-local copy, refused unless it loads weights-only.

    A remote checkpoint (``s3://``) is downloaded once per node, by local rank 0 into the scratch
    folder, while the node's other ranks wait; they all read that copy (not one download per rank of
    a multi-GB file). The FSDP loader also needs a local path: it makes the path a ``pathlib.Path``.
    """
    if resume is None:
        return resume
    import torch.distributed as dist

    if sharding.is_sharded_checkpoint(files.local_path(resume)):  # a DCP folder (local by config)
        meta = os.path.join(files.local_path(resume), sharding.META)
        torch.load(meta, map_location="cpu", weights_only=True)  # raises on pickled code
        return files.local_path(resume)

    local = resume if files.is_local(resume) else os.path.join(files.scratch_root(), "resume", LAST)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        if local != resume:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            fs, path = fsspec.core.url_to_fs(resume)
            fs.get_file(path, local)
        # raises on pickled code
        torch.load(local, map_location="cpu", weights_only=True, mmap=True)
    if dist.is_initialized():
        dist.barrier()
    return files.local_path(local)


def resume_decision(exists_per_rank: list[bool]) -> bool:
    """Rank 0 decides whether the run resumes (every rank sees this same list, one all-gather).

    Each rank deciding alone, on node-local checkpoint storage node 0 resumed and waited in a
    barrier while node 1 started fresh (a 30-minute hang). A rank that cannot see the checkpoint
    rank 0 resumes from is an error on every rank, not a hang.
    """
    if not exists_per_rank[0]:
        return False
    blind = [rank for rank, seen in enumerate(exists_per_rank) if not seen]
    if blind:
        raise FileNotFoundError(
            f"rank 0 resumes from {LAST} in checkpoint_dir, but ranks {blind} cannot see it: "
            "checkpoint_dir must be storage every node reads (a shared volume or an object store "
            "URL), not a node-local folder"
        )
    return True


def empty_test_metrics(test_url: str) -> dict[str, Any]:
    """What metrics.json says when the test split has no samples: no numbers, and why."""
    return {
        "accuracy": None,
        "macro_f1": None,
        "f1_per_class": {},
        "confusion_matrix": None,
        "test_samples": 0,
        "test_skipped": f"test split {test_url} is empty: the model was trained but not tested",
    }


def train(config: TrainerConfig) -> dict[str, Any]:
    """Fit, validate every epoch, keep the best validation's weights, test them, save; rank 0
    writes model/ + metrics.json, logs to MLflow.

    Side jobs are callbacks (:mod:`.callbacks`): throughput counters, progress lines, the Hugging
    Face export and MLflow registration.
    """
    rank, world, _ = torchrun_world()
    t0 = time.time()
    quiet_known_notices()
    # "auto" decided on the machine that trains; MLflow params and metrics.json record what ran.
    resolved = resolve_precision(config.precision, config.accelerator)
    if rank == 0 and resolved != config.precision:
        log.info("precision %s -> %s on this machine", config.precision, resolved)
    config = config.model_copy(update={"precision": resolved})
    # batch, eval batch and loader workers for this device (device_settings.py): everything below
    # (data, LR schedule, MLflow's parameters, metrics.json) sees the values that run
    gpu = on_gpu(config.accelerator)
    config, settings = device_settings.resolve(config, gpu, local_world=torchrun_world()[2])
    if rank == 0 and settings.batch_from != "batch_size":
        log.info(
            "GPU batch %d per device (%s: %s tokens at max_length %d), eval batch %d, %d loader "
            "workers",
            settings.batch_size,
            settings.batch_from,
            settings.batch_tokens,
            config.max_length,
            settings.eval_batch_size,
            settings.num_workers,
        )
    attempt = init_process_group(config)
    pl.seed_everything(config.seed, workers=True)
    tokenizer = AutoTokenizer.from_pretrained(config.model_dir, local_files_only=True)
    # Reads every split's index first: a missing or empty train split fails here, with its URL.
    datamodule = MdsDataModule(
        config,
        pad_token_id=tokenizer.pad_token_id or 0,
        run_key=config.checkpoint_dir,
        pin_memory=gpu,
        attempt=attempt,
    )
    weights = None
    if config.class_weights == "balanced":
        counts = config.train_label_counts()  # carried by the config (mds_shards' split_stats.json)
        weights = balanced_class_weights(counts)
        if rank == 0:
            log.info(
                "train label counts %s -> class weights %s", counts, [round(w, 4) for w in weights]
            )
    model, attention, fallback = device_settings.load_with_attention(
        lambda impl: load_classifier(config.model_dir, LabelSet(tuple(config.labels)), impl),
        config.attn_implementation,
    )
    settings = dataclasses.replace(settings, attn_implementation=attention, attn_fallback=fallback)
    module = ReviewClassifier(
        model,
        config,
        class_weights=weights,
        seed=config.seed,
    )
    if datamodule.is_empty("validation") and rank == 0:
        log.warning(
            "validation split %s is empty: training without validation", config.data.validation_url
        )
    logger = _mlflow_logger(config, rank)
    if logger is not None:
        # not the machine's facts (cpus, memory): a restart elsewhere would change a logged param
        chosen = {
            k: v for k, v in settings.record().items() if k not in ("cpus", "device_memory_gib")
        }
        logger.log_hyperparams({f"device.{k}": v for k, v in chosen.items()})
    throughput = Throughput()
    export = HuggingFaceCheckpointer(config, tokenizer, logger)
    validate = not datamodule.is_empty("validation")
    best = BestModel(config, validate)
    trainer = _trainer(
        config,
        logger if logger is not None else False,
        [
            throughput,
            Progress(throughput, config.progress_every_seconds),
            *best.callbacks(),  # before the export: it loads the best weights at fit end
            export,
            *pruning.callbacks(config, rank),
        ],
        validate=validate,
        parameters=sum(p.numel() for p in module.parameters()),
    )

    last = files.local_path(config.checkpoint_dir) + "/" + LAST
    if rank == 0:  # before anyone reads the checkpoint: a replaced gang's ranks commit no more
        fencing.raise_fence(config.checkpoint_dir)
    best_ckpt = f"{files.local_path(config.checkpoint_dir)}/{BEST_DIR}/{BEST}.ckpt"
    for saved in (last, best_ckpt) if rank == 0 and files.is_local(last) else ():
        if sharding.recover_swap(saved):
            log.warning("%s: the previous sharded checkpoint put back (a save broke off)", saved)
    gather(None)  # every rank looks after the recovery
    resume = last if resume_decision(gather(files.exists(last))) else None
    if resume and rank == 0:
        log.warning("resuming from %s", resume)
    timings: dict[str, float] = {"setup": time.time() - t0}
    t = time.time()
    try:
        trainer.fit(
            module, datamodule=datamodule, ckpt_path=_local_resume(resume), weights_only=True
        )
        timings["fit"] = time.time() - t  # with the Hugging Face export (on_fit_end)
        # A final checkpoint: re-running the same inputs after success resumes at the end, no
        # retraining.
        t = time.time()
        # the full state: a resume restores loops and callbacks
        trainer.save_checkpoint(last, weights_only=False)
        timings["final_checkpoint"] = time.time() - t
        t = time.time()
        if config.trial is not None:  # a tuning trial validates only: the selection never sees
            # test; the test split scores the final model once (core/tuning/study.py)
            test = {
                **empty_test_metrics(config.data.test_url),
                "test_skipped": "a tuning trial: scored on validation only",
            }
        elif datamodule.is_empty("test"):
            test = empty_test_metrics(config.data.test_url)
            if rank == 0:
                log.warning("%s", test["test_skipped"])
        else:
            trainer.test(module, datamodule=datamodule, verbose=False)
            test = {**module.test_results, "test_samples": datamodule.sizes["test"]}
        timings["test"] = time.time() - t
        # every rank of the node is done reading the cached shards
        trainer.strategy.barrier("mds-cache")
        local_leader = int(os.environ.get("LOCAL_RANK", 0)) == 0
        cached = per_node(datamodule.cached_shards("train") if local_leader else None)
        if local_leader:
            datamodule.remove_cache()
        metrics: dict[str, Any] = {
            **test,
            **throughput.summary(),
            "global_step": int(trainer.global_step),
            "epochs": int(trainer.current_epoch),
            "resumed_from": resume,
            "resumed_at_step": throughput.start_step if resume else None,
            "nonfinite_skipped": module.nonfinite_skipped,
            "world_size": world,
            "strategy": config.strategy,
            "parameters_per_rank": gather(local_parameters(module)),
            # as resolved on this machine ("auto" never appears here)
            "precision": config.precision,
            "class_weights": weights,
            "train_shards_cached_per_node": cached,  # of len(index) shards: about 1/nodes each
            # class names in id order: f1_per_class, confusion matrix rows/columns
            "labels": list(config.labels),
            "wall_seconds": time.time() - t0,
            "timings": timings,  # seconds per phase (where a run's time goes)
            "model_selection": best.selection().model_dump(),
            "device_settings": dataclasses.replace(
                settings, compiled_blocks=module.compiled_blocks
            ).record(),
        }
        if rank != 0:
            return metrics
        if logger is not None:
            logger.log_metrics(best.mlflow_metrics(), step=int(trainer.global_step))
        t = time.time()
        info = export.publish(metrics)
        timings["publish"] = time.time() - t  # MLflow logging + registration, then output_dir/model
        if info is not None:
            metrics["mlflow"] = info
    finally:
        export.cleanup()
    metrics["wall_seconds"] = time.time() - t0
    result = TrainingResult.model_validate(metrics)  # the contract finetuned_model reads
    files.write_json_atomic(
        f"{config.output_dir.rstrip('/')}/{TRAINING_RESULT_FILE}", result.model_dump(mode="json")
    )
    return metrics
