"""``train(config)``: what torchrun workers, the CLI and tests call (thin, like llm-foundry's)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import LearningRateMonitor
from pytorch_lightning.loggers import MLFlowLogger
from transformers import AutoTokenizer

from finetune_assets.core.io.contracts import TRAINING_RESULT_FILE, TrainingResult
from finetune_assets.core.labels.infer import LabelSet
from finetune_assets.core.training import device_settings
from finetune_assets.core.training.callbacks import BoundaryCheckpoint, Progress, Throughput
from finetune_assets.core.training.checkpoints import trainer_files as files
from finetune_assets.core.training.checkpoints.best import BestModel
from finetune_assets.core.training.checkpoints.resume import (
    last_checkpoint,
    local_resume,
    resume_point,
)
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.data.datamodule import MdsDataModule, balanced_class_weights
from finetune_assets.core.training.data.sharding import ShardedStrategy, local_parameters
from finetune_assets.core.training.device_settings import DeviceSettings, ddp_strategy, on_gpu
from finetune_assets.core.training.export import HuggingFaceCheckpointer, trainer_tracking_uri
from finetune_assets.core.training.module import ReviewClassifier, load_classifier
from finetune_assets.core.training.notices import quiet_known_notices
from finetune_assets.core.training.precision import resolve_precision
from finetune_assets.core.training.process_group import (
    gather,
    init_process_group,
    per_node,
    torchrun_world,
)
from finetune_assets.core.training.trial import pruning

log = logging.getLogger("finetune_assets.core.training")

# beside the checkpoints: a resumed run keeps logging into the same MLflow run
MLFLOW_RUN_FILE = "mlflow_run.json"


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
        # FSDP2 all-gathers its parameters inside the evaluation loop: under torch.inference_mode
        # (Lightning's default) they become inference tensors and `test` after `fit` fails ("do not
        # track version counter", the first GPU check); no_grad is what evaluation needs anyway.
        inference_mode=not isinstance(strategy, ShardedStrategy),
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
        plugins=[files.checkpoint_io(config.checkpoint_dir, config.accelerator)],
        enable_progress_bar=False,
        default_root_dir=files.local_path(config.checkpoint_dir),
    )


def _mlflow_logger(config: TrainerConfig, rank: int) -> MLFlowLogger | None:
    if rank != 0:
        return None
    m = config.mlflow
    run_file = files.local_path(config.checkpoint_dir) + "/" + MLFLOW_RUN_FILE
    run_id = None
    if files.exists(run_file) and files.exists(last_checkpoint(config)):
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


def _resolved_here(config: TrainerConfig, rank: int) -> tuple[TrainerConfig, DeviceSettings]:
    """The config with ``precision: auto`` and every device-dependent value decided on the machine
    that trains (:mod:`.device_settings`): everything after (data, LR schedule, MLflow's
    parameters, metrics.json) sees the values that run.
    """
    resolved = resolve_precision(config.precision, config.accelerator)
    if rank == 0 and resolved != config.precision:
        log.info("precision %s -> %s on this machine", config.precision, resolved)
    config = config.model_copy(update={"precision": resolved})
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
    return config, settings


def _class_weights(config: TrainerConfig, rank: int) -> list[float] | None:
    """``class_weights: balanced``: from the train label counts the config carries (mds_shards'
    split_stats.json); the trainer never counts the shards.
    """
    if config.class_weights != "balanced":
        return None
    counts = config.train_label_counts()
    weights = balanced_class_weights(counts)
    if rank == 0:
        rounded = [round(w, 4) for w in weights]
        log.info("train label counts %s -> class weights %s", counts, rounded)
    return weights


@dataclass
class _Run:
    """What :func:`train` builds before fitting: the config as resolved on this machine, and the
    parts that fit, test and publish.
    """

    config: TrainerConfig
    settings: DeviceSettings
    datamodule: MdsDataModule
    module: ReviewClassifier
    class_weights: list[float] | None
    logger: MLFlowLogger | None
    throughput: Throughput
    export: HuggingFaceCheckpointer
    best: BestModel
    trainer: pl.Trainer


def _build(config: TrainerConfig, rank: int) -> _Run:
    config, settings = _resolved_here(config, rank)
    attempt = init_process_group(config)
    pl.seed_everything(config.seed, workers=True)
    tokenizer = AutoTokenizer.from_pretrained(config.model_dir, local_files_only=True)
    # Reads every split's index first: a missing or empty train split fails here, with its URL.
    datamodule = MdsDataModule(
        config,
        pad_token_id=tokenizer.pad_token_id or 0,
        run_key=config.checkpoint_dir,
        pin_memory=on_gpu(config.accelerator),
        attempt=attempt,
    )
    weights = _class_weights(config, rank)
    model, attention, fallback = device_settings.load_with_attention(
        lambda impl: load_classifier(config.model_dir, LabelSet(tuple(config.labels)), impl),
        config.attn_implementation,
    )
    settings = dataclasses.replace(settings, attn_implementation=attention, attn_fallback=fallback)
    module = ReviewClassifier(model, config, class_weights=weights, seed=config.seed)
    validate = not datamodule.is_empty("validation")
    if not validate and rank == 0:
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
    return _Run(
        config, settings, datamodule, module, weights, logger, throughput, export, best, trainer
    )


@contextlib.contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    """``timings[phase]``: the seconds the block took (left out when it raises)."""
    t = time.time()
    yield
    timings[phase] = time.time() - t


def _test(run: _Run, rank: int) -> dict[str, Any]:
    """The test split's scores of the final (selected) weights, or why there are none."""
    config = run.config
    if config.trial is not None:  # a tuning trial validates only: the selection never sees
        # test; the test split scores the final model once (core/tuning/study.py)
        return {
            **empty_test_metrics(config.data.test_url),
            "test_skipped": "a tuning trial: scored on validation only",
        }
    if run.datamodule.is_empty("test"):
        test = empty_test_metrics(config.data.test_url)
        if rank == 0:
            log.warning("%s", test["test_skipped"])
        return test
    run.trainer.test(run.module, datamodule=run.datamodule, verbose=False)
    return {**run.module.test_results, "test_samples": run.datamodule.sizes["test"]}


def _release_shard_cache(run: _Run) -> int | None:
    """Remove the node's cached train shards once every rank is done with them; how many shards
    each node had cached (of ``len(index)``: about 1/nodes each).
    """
    run.trainer.strategy.barrier("mds-cache")
    local_leader = int(os.environ.get("LOCAL_RANK", 0)) == 0
    cached = per_node(run.datamodule.cached_shards("train") if local_leader else None)
    run.datamodule.release()
    if local_leader:
        run.datamodule.remove_cache()
    return cached


def train(config: TrainerConfig) -> dict[str, Any]:
    """Fit, validate every epoch, keep the best validation's weights, test them, save; rank 0
    writes model/ + metrics.json, logs to MLflow.

    Side jobs are callbacks (:mod:`.callbacks`, :mod:`.export`): throughput counters, progress
    lines, the Hugging Face export and MLflow registration.
    """
    rank, world, _ = torchrun_world()
    t0 = time.time()
    quiet_known_notices()
    run = _build(config, rank)
    config, module, trainer, throughput = run.config, run.module, run.trainer, run.throughput
    resume = resume_point(config, rank)
    timings: dict[str, float] = {"setup": time.time() - t0}
    try:
        with _timed(timings, "fit"):  # with the Hugging Face export (on_fit_end)
            trainer.fit(
                module, datamodule=run.datamodule, ckpt_path=local_resume(resume), weights_only=True
            )
        # A final checkpoint: re-running the same inputs after success resumes at the end, no
        # retraining. The full state: a resume restores loops and callbacks.
        with _timed(timings, "final_checkpoint"):
            trainer.save_checkpoint(last_checkpoint(config), weights_only=False)
        with _timed(timings, "test"):
            test = _test(run, rank)
        cached = _release_shard_cache(run)
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
            "class_weights": run.class_weights,
            "train_shards_cached_per_node": cached,
            # class names in id order: f1_per_class, confusion matrix rows/columns
            "labels": list(config.labels),
            "wall_seconds": time.time() - t0,
            "timings": timings,  # seconds per phase (where a run's time goes)
            "model_selection": run.best.selection().model_dump(),
            "device_settings": dataclasses.replace(
                run.settings, compiled_blocks=module.compiled_blocks
            ).record(),
        }
        if rank != 0:
            return metrics
        if run.logger is not None:
            run.logger.log_metrics(run.best.mlflow_metrics(), step=int(trainer.global_step))
        with _timed(timings, "publish"):  # MLflow logging + registration, then output_dir/model
            info = run.export.publish(metrics)
        if info is not None:
            metrics["mlflow"] = info
    finally:
        run.export.cleanup()
        run.datamodule.release()  # a failed run too: a process that lives on keeps no blocks
    metrics["wall_seconds"] = time.time() - t0
    result = TrainingResult.model_validate(metrics)  # the contract finetuned_model reads
    files.write_json_atomic(
        f"{config.output_dir.rstrip('/')}/{TRAINING_RESULT_FILE}", result.model_dump(mode="json")
    )
    return metrics
