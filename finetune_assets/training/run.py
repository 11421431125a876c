"""``train(config)``: the one function torchrun workers, the CLI and tests call (thin, like llm-foundry's)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.loggers import MLFlowLogger
from transformers import AutoTokenizer

from finetune_assets.training import files
from finetune_assets.training.config import TrainerConfig
from finetune_assets.training.datamodule import MdsDataModule, balanced_class_weights, label_counts
from finetune_assets.data.labels import LabelSet
from finetune_assets.training.module import ReviewClassifier, export_classifier, load_classifier

log = logging.getLogger("finetune_assets.training")

LAST = "last.ckpt"
MLFLOW_RUN_FILE = "mlflow_run.json"  # beside the checkpoints: a resumed run keeps logging into the same MLflow run


def _world() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def safe_uri(uri: str | None) -> str | None:
    """A tracking URI without credentials (``https://user:token@host`` -> ``https://host``)."""
    if not uri or "@" not in uri:
        return uri
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))


def tracking_uri(config: TrainerConfig) -> str:
    uri = config.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    if files.is_local(config.output_dir):  # standalone CLI use: an embedded store beside the output
        return f"sqlite:///{Path(files.local_path(config.output_dir)).resolve()}/mlflow.db"
    raise ValueError("mlflow.tracking_uri is empty, MLFLOW_TRACKING_URI is unset and output_dir is remote")


def _init_process_group(config: TrainerConfig) -> None:
    """Join the process group through a store prefix unique to this torchrun attempt.

    After torchrun restarts a worker group, the agent's store still holds the previous attempt's
    keys; gloo then reads a dead rank's address and fails with "connectFullMesh ... Connection
    refused" when the new ranks start at different speeds. Keys under ``attempt_<restart count>``
    are always fresh. Lightning sees the group initialised and uses it.
    """
    import datetime

    import torch.distributed as dist
    from torch.distributed.rendezvous import _torchelastic_use_agent_store

    rank, world, _ = _world()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if world == 1 or attempt is None or dist.is_initialized():
        return
    timeout = datetime.timedelta(minutes=30)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
        is_master=rank == 0 and not _torchelastic_use_agent_store(), timeout=timeout,
    )
    gpu = config.accelerator != "cpu" and torch.cuda.is_available()
    dist.init_process_group(
        "nccl" if gpu else "gloo", store=dist.PrefixStore(f"/finetune_assets/attempt_{attempt}", store),
        rank=rank, world_size=world, timeout=timeout,
    )


def _trainer(config: TrainerConfig, logger: MLFlowLogger | bool, validate: bool = True) -> pl.Trainer:
    _, world, local_world = _world()
    strategy: Any = config.strategy
    if world == 1 and strategy == "ddp":
        strategy = "auto"  # one process: no process group needed
    checkpoint = ModelCheckpoint(
        dirpath=files.local_path(config.checkpoint_dir),
        filename="step-{step}",
        every_n_train_steps=config.checkpoint_every_n_steps,
        save_top_k=0,
        save_last=True,
    )
    callbacks: list[pl.Callback] = [checkpoint]
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
        check_val_every_n_epoch=1,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,  # StreamingDataset partitions samples across ranks itself
        limit_train_batches=config.limit_train_batches,
        limit_val_batches=config.limit_val_batches if validate else 0,  # 0: Lightning never builds the loader
        limit_test_batches=config.limit_test_batches,
        logger=logger,
        callbacks=callbacks,
        plugins=[files.AtomicCheckpointIO()],
        enable_progress_bar=False,
        default_root_dir=files.local_path(config.checkpoint_dir),
    )


def _mlflow_logger(config: TrainerConfig, rank: int) -> MLFlowLogger | None:
    if rank != 0:
        return None
    m = config.mlflow
    run_file = files.local_path(config.checkpoint_dir) + "/" + MLFLOW_RUN_FILE
    run_id = None
    if files.exists(run_file) and files.exists(files.local_path(config.checkpoint_dir) + "/" + LAST):
        run_id = files.read_json(run_file).get("run_id")
    logger = MLFlowLogger(
        experiment_name=m.experiment_name,
        run_name=m.run_name,
        tracking_uri=tracking_uri(config),
        tags=dict(m.tags) or None,
        artifact_location=m.artifact_location,
        run_id=run_id,
    )
    files.write_json_atomic(run_file, {"run_id": logger.run_id, "experiment_id": logger.experiment_id})
    logger.log_hyperparams(config.hparams())
    return logger


def _confusion_figure(matrix: list[list[int]], labels: list[str]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            ax.text(j, i, str(v), ha="center", va="center")
    fig.tight_layout()
    return fig


def _log_to_mlflow(config: TrainerConfig, logger: MLFlowLogger, model_dir: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """Confusion matrix, metrics file and the model (transformers flavor), registered as a new version."""
    import mlflow
    import transformers

    client = logger.experiment
    run_id = logger.run_id
    if metrics.get("confusion_matrix"):  # None when the test split was empty
        fig = _confusion_figure(metrics["confusion_matrix"], list(config.labels))
        client.log_figure(run_id, fig, "confusion_matrix.png")
    client.log_dict(run_id, metrics, "metrics.json")
    info: dict[str, Any] = {
        "run_id": run_id,
        "experiment_id": logger.experiment_id,
        "tracking_uri": safe_uri(tracking_uri(config)),
        "registered_model_name": None,
        "registered_model_version": None,
    }
    uri = tracking_uri(config)
    if uri.startswith(("http://", "https://")):
        info["run_url"] = f"{safe_uri(uri).rstrip('/')}/#/experiments/{logger.experiment_id}/runs/{run_id}"
    if not config.mlflow.log_model:
        return info
    mlflow.set_tracking_uri(uri)
    # The registry is the tracking store: an inherited MLFLOW_REGISTRY_URI must not divert the version.
    mlflow.set_registry_uri(uri)
    pipe = transformers.pipeline("text-classification", model=str(model_dir), tokenizer=str(model_dir), device=-1)
    with mlflow.start_run(run_id=run_id):
        model_info = mlflow.transformers.log_model(
            transformers_model=pipe,
            name="model",
            task="text-classification",
            registered_model_name=config.mlflow.registered_model_name,
            pip_requirements=[f"transformers=={transformers.__version__}", f"torch=={torch.__version__.split('+')[0]}"],
            input_example=["a fine product"],
        )
    version = getattr(model_info, "registered_model_version", None)
    if config.mlflow.registered_model_name and version is not None:
        for key, value in config.mlflow.tags.items():
            client.set_model_version_tag(config.mlflow.registered_model_name, str(version), key, value)
        info["registered_model_name"] = config.mlflow.registered_model_name
        info["registered_model_version"] = int(version)
    info["model_uri"] = model_info.model_uri
    return info


def _save_model(model_config: Any, state: dict[str, torch.Tensor], tokenizer: Any) -> Path:
    """Rank 0: the trained weights as an HF folder (safetensors) + tokenizer, in a local staging folder,
    exported with the trained model's own class and config (its id2label included)."""
    model = export_classifier(model_config, state)
    staging = Path(tempfile.mkdtemp(prefix="model-"))
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    return staging


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
    """Fit, validate every epoch, test, save; rank 0 writes model/ + metrics.json and logs to MLflow."""
    rank, world, _ = _world()
    t0 = time.time()
    _init_process_group(config)
    pl.seed_everything(config.seed, workers=True)
    tokenizer = AutoTokenizer.from_pretrained(config.model_dir, local_files_only=True)
    # Reads every split's index first: a missing or empty train split fails here, with its URL.
    datamodule = MdsDataModule(config.data, pad_token_id=tokenizer.pad_token_id or 0, run_key=config.checkpoint_dir)
    weights = None
    if config.class_weights == "balanced":
        counts = label_counts(config.data.train_url, len(config.labels))
        weights = balanced_class_weights(counts)
        if rank == 0:
            log.info("train label counts %s -> class weights %s", counts, [round(w, 4) for w in weights])
    module = ReviewClassifier(load_classifier(config.model_dir, LabelSet(tuple(config.labels))), config.optim, class_weights=weights, seed=config.seed)
    if datamodule.is_empty("validation") and rank == 0:
        log.warning("validation split %s is empty: training without validation", config.data.validation_url)
    logger = _mlflow_logger(config, rank)
    trainer = _trainer(config, logger if logger is not None else False, validate=not datamodule.is_empty("validation"))

    last = files.local_path(config.checkpoint_dir) + "/" + LAST
    resume = last if files.exists(last) else None
    if resume and rank == 0:
        log.warning("resuming from %s", resume)
    timings: dict[str, float] = {"setup": time.time() - t0}
    t = time.time()
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)
    timings["fit"] = time.time() - t
    # A final checkpoint: re-running the same inputs after success resumes at the end instead of retraining.
    t = time.time()
    trainer.save_checkpoint(last)
    timings["final_checkpoint"] = time.time() - t
    t = time.time()
    if datamodule.is_empty("test"):
        test = empty_test_metrics(config.data.test_url)
        if rank == 0:
            log.warning("%s", test["test_skipped"])
    else:
        trainer.test(module, datamodule=datamodule, verbose=False)
        test = {**module.test_results, "test_samples": datamodule.sizes["test"]}

    state = trainer.strategy.lightning_module_state_dict()  # a collective under FSDP: every rank calls it
    timings["test"] = time.time() - t
    trainer.strategy.barrier("mds-cache")  # every rank of the node is done reading the cached shards
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        datamodule.remove_cache()
    seconds = max(module.train_seconds, 1e-9)
    metrics: dict[str, Any] = {
        **test,
        "samples_seen": module.samples_seen,
        "tokens_seen": module.tokens_seen,
        "train_seconds": module.train_seconds,
        "samples_per_sec": module.samples_seen / seconds,
        "tokens_per_sec": module.tokens_seen / seconds,
        "global_step": int(trainer.global_step),
        "epochs": int(trainer.current_epoch),
        "resumed_from": resume,
        "resumed_at_step": module.start_step if resume else None,
        "world_size": world,
        "class_weights": weights,
        "labels": list(config.labels),  # class names in id order: f1_per_class, confusion matrix rows/columns
        "wall_seconds": time.time() - t0,
        "timings": timings,  # seconds per phase (where a run's time goes)
    }
    if rank != 0:
        return metrics
    t = time.time()
    staging = _save_model(module.model.config, state, tokenizer)
    timings["save_model"] = time.time() - t
    try:
        if logger is not None:
            logger.log_metrics(
                {"final/samples_per_sec": metrics["samples_per_sec"], "final/tokens_per_sec": metrics["tokens_per_sec"],
                 "final/samples_seen": float(metrics["samples_seen"])},
                step=metrics["global_step"],
            )
            logger.finalize("success")
            t = time.time()
            metrics["mlflow"] = _log_to_mlflow(config, logger, staging, metrics)
            timings["mlflow"] = time.time() - t
        files.publish_dir(staging, config.output_dir.rstrip("/") + "/model")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    metrics["wall_seconds"] = time.time() - t0
    files.write_json_atomic(config.output_dir.rstrip("/") + "/metrics.json", metrics)
    return metrics
