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

import fsspec
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.loggers import MLFlowLogger
from pytorch_lightning.strategies import FSDPStrategy
from transformers import AutoTokenizer

from finetune_assets.training import files
from finetune_assets.training.config import TrainerConfig
from finetune_assets.training.datamodule import MdsDataModule, balanced_class_weights, label_counts
from finetune_assets.data.labels import LabelSet
from finetune_assets.training.module import ReviewClassifier, export_classifier, load_classifier
from finetune_assets.training.precision import resolve_precision

log = logging.getLogger("finetune_assets.training")

LAST = "last.ckpt"
TRAINING_KEY_TAG = "training_inputs"  # model-version tag: hash of the run's inputs + config (idempotent registration)
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


ATTEMPT_KEYS = "/finetune_assets/attempt"


def agree_on_attempt(store: Any, rank: int, world: int, timeout: float = 1800.0, poll: float = 0.05) -> str:
    """A token that every rank of this start of the worker group gets, and no earlier start had.

    The agent's store outlives worker restarts, so the process group's keys must sit under a prefix
    that is fresh per start and equal on every node. ``TORCHELASTIC_RESTART_COUNT`` is not: it counts
    one node agent's own restarts, so after one node's workers fail the nodes disagree and never
    meet. Instead rank 0 draws a token and hands it to each rank that asks with a fresh nonce
    (stale asks left by a previous start are answered harmlessly); it returns once every rank has
    acknowledged *this* token, which no earlier start could have done.
    """
    import datetime
    import uuid

    if rank != 0:
        nonce = uuid.uuid4().hex
        store.set(f"{ATTEMPT_KEYS}/ask/{rank}", nonce)
        answer = f"{ATTEMPT_KEYS}/answer/{nonce}"
        store.wait([answer], datetime.timedelta(seconds=timeout))
        token = store.get(answer).decode()
        store.set(f"{ATTEMPT_KEYS}/ack/{token}/{rank}", "1")
        return token
    token = uuid.uuid4().hex
    waiting, answered = set(range(1, world)), {}
    deadline = time.monotonic() + timeout
    while waiting:
        for r in sorted(waiting):
            if store.check([f"{ATTEMPT_KEYS}/ack/{token}/{r}"]):
                waiting.discard(r)
            elif store.check([f"{ATTEMPT_KEYS}/ask/{r}"]):
                nonce = store.get(f"{ATTEMPT_KEYS}/ask/{r}").decode()
                if answered.get(r) != nonce:
                    store.set(f"{ATTEMPT_KEYS}/answer/{nonce}", token)
                    answered[r] = nonce
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"ranks {sorted(waiting)} did not join the process group within {timeout:.0f}s")
        time.sleep(poll if waiting else 0)
    return token


def _init_process_group(config: TrainerConfig) -> str | None:
    """Join the process group through a store prefix unique to this start of the worker group.

    After torchrun restarts a worker group, the agent's store still holds the previous attempt's
    keys; gloo then reads a dead rank's address and fails with "connectFullMesh ... Connection
    refused" when the new ranks start at different speeds. Keys under the token of
    :func:`agree_on_attempt` are always fresh, on every node. Lightning sees the group initialised
    and uses it. Returns the token (None outside a multi-process torchrun).
    """
    import datetime

    import torch.distributed as dist
    from torch.distributed.rendezvous import _torchelastic_use_agent_store

    rank, world, _ = _world()
    if world == 1 or "TORCHELASTIC_RUN_ID" not in os.environ or dist.is_initialized():
        return None
    timeout = datetime.timedelta(minutes=30)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
        is_master=rank == 0 and not _torchelastic_use_agent_store(), timeout=timeout,
    )
    token = agree_on_attempt(store, rank, world, timeout=timeout.total_seconds())
    log.info("rank %d joins attempt %s (this node's restart count %s)", rank, token[:8],
             os.environ.get("TORCHELASTIC_RESTART_COUNT"))
    gpu = config.accelerator != "cpu" and torch.cuda.is_available()
    dist.init_process_group(
        "nccl" if gpu else "gloo", store=dist.PrefixStore(f"/finetune_assets/{token}", store),
        rank=rank, world_size=world, timeout=timeout,
    )
    return token


def encoder_layer_class(model: torch.nn.Module) -> type[torch.nn.Module]:
    """The encoder's repeated block class (``BertLayer``, ``XLMRobertaLayer``, ``TransformerBlock``...): FSDP's unit.

    The class of the first list of two or more identical blocks (what every encoder keeps its layers
    in); wrapping the whole model as one unit would shard nothing, wrapping only a sub-module of the
    block (some ``_no_split_modules`` name attention classes) would leave the feed-forward unsharded.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1:
            return type(module[0])
    raise ValueError(f"{type(model).__name__}: no repeated encoder block found to wrap for FSDP; use strategy 'ddp'")


class ObjectStoreFSDPStrategy(FSDPStrategy):
    """FSDP whose full-state checkpoints go through the checkpoint IO with the path as given.

    Lightning's ``FSDPStrategy.save_checkpoint`` turns the path into a ``pathlib.Path`` first, which
    makes ``s3://b/x`` the local ``s3:/b/x``. ``train`` hands FSDP a local, weights-only-checked copy
    of a remote checkpoint to load (:func:`_local_resume`).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if self._state_dict_type != "full":  # pragma: no cover - only "full" is configured
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint, str(filepath))


def _strategy(config: TrainerConfig, model: torch.nn.Module, world: int) -> Any:
    if config.strategy != "fsdp":
        return "auto" if world == 1 and config.strategy == "ddp" else config.strategy
    from torch.distributed.fsdp import MixedPrecision

    mixed = None
    if config.precision in ("bf16-mixed", "16-mixed"):  # compute in low precision, reduce gradients in fp32
        low = torch.bfloat16 if config.precision == "bf16-mixed" else torch.float16
        mixed = MixedPrecision(param_dtype=low, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
    return ObjectStoreFSDPStrategy(
        auto_wrap_policy={encoder_layer_class(model)},
        mixed_precision=mixed,
        use_orig_params=True,  # parameter names survive wrapping: decay groups and clipping by name
        state_dict_type="full",
        sharding_strategy="FULL_SHARD",
    )


def _trainer(config: TrainerConfig, logger: MLFlowLogger | bool, model: torch.nn.Module,
             validate: bool = True) -> pl.Trainer:
    _, world, local_world = _world()
    strategy = _strategy(config, model, world)
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
    name = config.mlflow.registered_model_name
    key = config.mlflow.tags.get(TRAINING_KEY_TAG)
    if name and key:  # a retry of the same inputs + config reuses its version instead of registering another
        found = mlflow.MlflowClient(uri, registry_uri=uri).search_model_versions(
            f"name = '{name}' and tags.{TRAINING_KEY_TAG} = '{key}'")
        if found:
            version = min(found, key=lambda mv: int(mv.version))
            log.warning("model already registered for training key %s: reusing %s v%s", key, name, version.version)
            info.update(registered_model_name=name, registered_model_version=int(version.version),
                        model_uri=f"models:/{name}/{version.version}", reused_registration=True)
            return info
    pipe = transformers.pipeline("text-classification", model=str(model_dir), tokenizer=str(model_dir), device=-1)
    with mlflow.start_run(run_id=run_id):
        model_info = mlflow.transformers.log_model(
            transformers_model=pipe,
            name="model",
            task="text-classification",
            pip_requirements=[f"transformers=={transformers.__version__}", f"torch=={torch.__version__.split('+')[0]}"],
            input_example=["a fine product"],
        )
    if name:
        # Registered with its tags in one call: a version never exists without the key that finds it again.
        version = mlflow.register_model(model_info.model_uri, name, tags=dict(config.mlflow.tags))
        info["registered_model_name"] = name
        info["registered_model_version"] = int(version.version)
    info["model_uri"] = model_info.model_uri
    return info


def _save_model(model_config: Any, state: dict[str, torch.Tensor], tokenizer: Any) -> Path:
    """Rank 0: the trained weights as an HF folder (safetensors) + tokenizer, in a local staging folder,
    exported with the trained model's own class and config (its id2label included)."""
    model = export_classifier(model_config, state)
    os.makedirs(files.scratch_root(), exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="model-", dir=files.scratch_root()))  # the cache volume, not /tmp
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    return staging


def _within(seconds: float, what: str, fn: Any) -> Any:
    """``fn()`` on a daemon thread, waited for at most ``seconds``: a hung tracking server fails the run
    (whose final checkpoint makes a re-run go straight to logging) instead of holding it forever."""
    import threading

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            box["error"] = err

    thread = threading.Thread(target=target, name="mlflow-logging", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not finish within {seconds:.0f}s (mlflow.timeout_seconds); "
                           "check the tracking server, then re-run: training resumes at its final checkpoint")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _per_node(value: Any) -> list[Any]:
    """``value`` of each node's local leader (the others pass None), in node order: one all-gather."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return [v for v in gathered if v is not None]


def _local_resume(config: TrainerConfig, resume: str | None) -> str | None:
    """The checkpoint path to hand Lightning; under FSDP a local copy, refused unless it loads weights-only.

    Lightning's FSDP loader makes the path a ``pathlib.Path`` (``s3://`` breaks) and unpickles it
    without ``weights_only``: local rank 0 downloads it into the scratch folder and checks it the way
    DDP's loader would, while the node's other ranks wait.
    """
    if resume is None or config.strategy != "fsdp":
        return resume
    import torch.distributed as dist

    local = resume if files.is_local(resume) else os.path.join(files.scratch_root(), "resume", LAST)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        if local != resume:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            fs, path = fsspec.core.url_to_fs(resume)
            fs.get_file(path, local)
        torch.load(local, map_location="cpu", weights_only=True, mmap=True)  # raises on pickled code
    if dist.is_initialized():
        dist.barrier()
    return files.local_path(local)


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
    # "auto" decided on the machine that trains; MLflow params and metrics.json record what ran.
    resolved = resolve_precision(config.precision, config.accelerator)
    if rank == 0 and resolved != config.precision:
        log.info("precision %s -> %s on this machine", config.precision, resolved)
    config = config.model_copy(update={"precision": resolved})
    attempt = _init_process_group(config)
    pl.seed_everything(config.seed, workers=True)
    tokenizer = AutoTokenizer.from_pretrained(config.model_dir, local_files_only=True)
    # Reads every split's index first: a missing or empty train split fails here, with its URL.
    datamodule = MdsDataModule(config, pad_token_id=tokenizer.pad_token_id or 0, run_key=config.checkpoint_dir,
                               pin_memory=config.accelerator != "cpu" and torch.cuda.is_available(), attempt=attempt)
    weights = None
    if config.class_weights == "balanced":
        counts = label_counts(config.data.train_url, len(config.labels))
        weights = balanced_class_weights(counts)
        if rank == 0:
            log.info("train label counts %s -> class weights %s", counts, [round(w, 4) for w in weights])
    module = ReviewClassifier(load_classifier(config.model_dir, LabelSet(tuple(config.labels))), config,
                              class_weights=weights, seed=config.seed)
    if datamodule.is_empty("validation") and rank == 0:
        log.warning("validation split %s is empty: training without validation", config.data.validation_url)
    logger = _mlflow_logger(config, rank)
    trainer = _trainer(config, logger if logger is not None else False, module.model,
                       validate=not datamodule.is_empty("validation"))

    last = files.local_path(config.checkpoint_dir) + "/" + LAST
    resume = last if files.exists(last) else None
    if resume and rank == 0:
        log.warning("resuming from %s", resume)
    timings: dict[str, float] = {"setup": time.time() - t0}
    t = time.time()
    trainer.fit(module, datamodule=datamodule, ckpt_path=_local_resume(config, resume), weights_only=True)
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
    local_leader = int(os.environ.get("LOCAL_RANK", 0)) == 0
    cached = _per_node(datamodule.cached_shards("train") if local_leader else None)
    if local_leader:
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
        "precision": config.precision,  # as resolved on this machine ("auto" never appears here)
        "class_weights": weights,
        "train_shards_cached_per_node": cached,  # of len(index) shards: about 1/nodes each
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
            metrics["mlflow"] = _within(config.mlflow.timeout_seconds, "MLflow logging and model registration",
                                        lambda: _log_to_mlflow(config, logger, staging, metrics))
            timings["mlflow"] = time.time() - t
        files.publish_dir(staging, config.output_dir.rstrip("/") + "/model")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    metrics["wall_seconds"] = time.time() - t0
    files.write_json_atomic(config.output_dir.rstrip("/") + "/metrics.json", metrics)
    return metrics
