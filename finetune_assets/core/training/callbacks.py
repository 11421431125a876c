"""The trainer's side jobs as Lightning callbacks, so ``train()`` and ``ReviewClassifier`` stay
about training.

- :class:`~.throughput.Throughput` (in :mod:`.throughput`): run totals and the steady-state window.
- :class:`Progress`: rank 0 writes one progress line at a steady time interval (step/total, epoch,
  loss, samples/s, ETA) to the log, which both launchers forward to the Dagster log, and the same
  numbers as ``progress/*`` metrics to MLflow.
- :class:`BoundaryCheckpoint`: ``last.ckpt`` only right after an optimizer step (never inside a
  gradient accumulation window), with no per-batch host sync.
- :class:`HuggingFaceCheckpointer`: at the end of fit, the trained weights as a Hugging Face folder;
  then (:meth:`~HuggingFaceCheckpointer.publish`) the MLflow artifacts, the transformers-flavor
  model and its registered version, and the folder published under ``output_dir/model``. Modelled on
  llm-foundry's ``HuggingFaceCheckpointer`` (which also exports at fit end and registers to MLflow).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.io import tracking
from finetune_assets.core.training import PROGRESS
from finetune_assets.core.training.checkpoints import trainer_files as files
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.module import export_classifier
from finetune_assets.core.training.throughput import CHECKPOINT_KEY, Throughput

__all__ = [
    "CHECKPOINT_KEY",
    "BoundaryCheckpoint",
    "HuggingFaceCheckpointer",
    "Progress",
    "Throughput",
    "trainer_tracking_uri",
    "within",
]

log = logging.getLogger("finetune_assets.core.training")

# model-version tag: hash of the run's inputs + config (idempotent registration)
TRAINING_KEY_TAG = "training_inputs"


def trainer_tracking_uri(config: TrainerConfig) -> str:
    """The run's MLflow store: the rule of :mod:`finetune_assets.core.io.tracking`, embedded beside
    a
    local output.
    """
    return tracking.tracking_uri(
        config.mlflow.tracking_uri,
        files.local_path(config.output_dir),
        "set mlflow.tracking_uri (or MLFLOW_TRACKING_URI)",
    )


# -- progress ------------------------------------------------------------------------------------


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress(pl.Callback):
    """Rank 0: one line every ``every_seconds`` of training, and once at the end.

    ``progress: step 120/400 (30%) | epoch 1/2 | loss 0.4123 | 38.2 samples/s | ETA 0:02:11``: the
    loss is rank 0's mean since the last line, samples/s and ETA are over this start's steps (a
    resumed run does not count the steps it skipped). Time-based, not step-based, so a slow CPU run
    and a fast GPU run both report at a pace a person can read.
    """

    def __init__(
        self, throughput: Throughput, every_seconds: float = 30.0, logger: logging.Logger = log
    ):
        self.throughput = throughput
        self.every_seconds = every_seconds
        self._log = logger
        self._total: int | None = None
        self._t0 = self._last = 0.0
        self._step0 = 0
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        total = (
            pl_module.total_steps()
            if hasattr(pl_module, "total_steps")
            else trainer.estimated_stepping_batches
        )
        self._total = int(total) if math.isfinite(total) else None
        if trainer.max_steps and trainer.max_steps > 0:
            self._total = min(self._total or trainer.max_steps, trainer.max_steps)
        self._t0 = self._last = time.perf_counter()
        self._step0 = int(trainer.global_step)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not trainer.is_global_zero:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        # summed on the device: read (one host sync) only when reporting
        if isinstance(loss, torch.Tensor):
            self._loss_sum = loss.detach().float() + (
                self._loss_sum if self._loss_sum is not None else 0.0
            )
            self._loss_count += 1
        if time.perf_counter() - self._last >= self.every_seconds:
            self.report(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.report(trainer)

    def report(self, trainer: pl.Trainer) -> str:
        now = time.perf_counter()
        step = int(trainer.global_step)
        rate_steps = (step - self._step0) / max(now - self._t0, 1e-9)
        samples_per_sec = self.throughput.estimated_samples(trainer.world_size) / max(
            self.throughput.elapsed(), 1e-9
        )
        loss = (
            float(self._loss_sum) / self._loss_count if self._loss_sum is not None else float("nan")
        )
        total = self._total
        eta = (total - step) / rate_steps if total is not None and rate_steps > 0 else float("inf")
        if total is not None and step >= total:
            eta = 0.0
        where = (
            f"step {step}/{total} ({step / max(total, 1):.0%})"
            if total is not None
            else f"step {step}"
        )
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        # 1 past at the end
        epoch = (
            trainer.current_epoch + 1 if epochs is None else min(trainer.current_epoch + 1, epochs)
        )
        line = (
            f"{PROGRESS} {where} | epoch {epoch}/{epochs or '?'} | loss {loss:.4f} | "
            f"{samples_per_sec:.1f} samples/s | ETA {_clock(eta)}"
        )
        self._log.info(line)
        if trainer.logger:
            metrics = {
                "progress/fraction": step / total if total else 0.0,
                "progress/samples_per_sec": samples_per_sec,
            }
            if math.isfinite(eta):
                metrics["progress/eta_seconds"] = eta
            if math.isfinite(loss):
                metrics["progress/loss"] = loss
            trainer.logger.log_metrics(metrics, step=step)
        self._last, self._loss_sum, self._loss_count = now, None, 0
        return line


# -- checkpoints -----------------------------------------------------------------------------------


class BoundaryCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, consulted only on the batch whose optimizer step just ran.

    Lightning's own trigger runs at every micro-batch end, and so
    - can save inside a gradient accumulation window (the time trigger, or the step trigger on the
      first micro-batch after a resume, since the step already saved is not in its state): the
      loader state then counts micro-batches whose gradients the checkpoint lacks, and a resume is
      not exact;
    - with ``train_time_interval`` broadcasts rank 0's clock decision every micro-batch: a host
      round trip per batch on a GPU.
    Here a save happens only where ``global_step`` just advanced (a Python int: no sync), and the
    time trigger is evaluated (and broadcast) only every ``time_check_every_n_steps`` steps.
    """

    def __init__(self, *args: Any, time_check_every_n_steps: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.time_check_every_n_steps = max(1, time_check_every_n_steps)
        self._step_seen: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # a resumed run's step was saved by the checkpoint it resumed from
        self._step_seen = int(trainer.global_step)
        self._last_global_step_saved = int(trainer.global_step)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = int(trainer.global_step)
        if step == self._step_seen:
            return  # inside an accumulation window: no optimizer step on this batch
        self._step_seen = step
        if self._train_time_interval is not None and step % self.time_check_every_n_steps:
            return  # the clock is read (and rank 0's decision broadcast) only every N steps
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


# -- Hugging Face export + MLflow registration ---------------------------------------------------


def within(seconds: float, what: str, fn: Any) -> Any:
    """``fn()`` on a daemon thread, waited for at most ``seconds``: a hung tracking server fails the
    run (whose final checkpoint makes a re-run go straight to logging) instead of holding it
    forever.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # re-raised in the caller
            box["error"] = err

    thread = threading.Thread(target=target, name="mlflow-logging", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(
            f"{what} did not finish within {seconds:.0f}s (mlflow.timeout_seconds); "
            "check the tracking server, then re-run: training resumes at its final checkpoint"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


def _signature() -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string")]),
        outputs=Schema([ColSpec("string", name="label"), ColSpec("double", name="score")]),
    )


class _DropLocalModelCardNotice(logging.Filter):
    """mlflow asks the Hub for a model card named by the pipeline's path; ours is a local folder,
    never a repo.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(
            "The model card could not be retrieved from the hub"
        )


class HuggingFaceCheckpointer(pl.Callback):
    """The trained model as a Hugging Face folder, logged and registered in MLflow, published
    atomically.

    ``on_fit_end`` gathers the weights (a collective under FSDP: every rank takes part) and rank 0
    saves them with the tokenizer into a local staging folder (the scratch volume, not /tmp).
    :meth:`publish`, called by ``train()`` once the test metrics exist, logs them and the model to
    MLflow (bounded by ``mlflow.timeout_seconds``) and publishes the folder to ``output_dir/model``.
    """

    def __init__(self, config: TrainerConfig, tokenizer: Any, logger: Any = None):
        self.config = config
        self.tokenizer = tokenizer
        self.logger = logger  # the run's MLFlowLogger on rank 0, else None
        self.staging: Path | None = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strategy = trainer.strategy
        # gathered on rank 0 (a collective); under sharded checkpoints Lightning's own would be
        # the shards
        full = getattr(strategy, "full_state_dict", strategy.lightning_module_state_dict)
        state = full()
        if trainer.is_global_zero:
            self.cleanup()
            # the trained model's class and id2label
            model = export_classifier(pl_module.model.config, state, self.config.export_dtype)
            os.makedirs(files.scratch_root(), exist_ok=True)
            self.staging = Path(tempfile.mkdtemp(prefix="model-", dir=files.scratch_root()))
            model.save_pretrained(self.staging, safe_serialization=True)
            self.tokenizer.save_pretrained(self.staging)

    def publish(self, metrics: dict[str, Any]) -> dict[str, Any] | None:
        """Rank 0: MLflow logging and registration (when a logger is set), then
        ``output_dir/model``.

        Returns what MLflow recorded (run, registered version), None without a logger.
        """
        if self.staging is None:
            raise RuntimeError("publish() before the end of fit: no model was exported")
        try:
            info = None
            if self.logger is not None:
                self.logger.finalize("success")
                info = within(
                    self.config.mlflow.timeout_seconds,
                    "MLflow logging and model registration",
                    lambda: self._log_to_mlflow(metrics),
                )
            files.publish_dir(self.staging, self.config.output_dir.rstrip("/") + "/model")
            return info
        finally:
            self.cleanup()

    def cleanup(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None

    def _log_to_mlflow(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Confusion matrix, metrics file and the model (transformers flavor), registered as a
        new version.
        """
        card_notice = _DropLocalModelCardNotice()
        logging.getLogger("mlflow.transformers").addFilter(card_notice)
        try:
            return self._log_model(metrics)
        finally:
            logging.getLogger("mlflow.transformers").removeFilter(card_notice)

    def _log_model(self, metrics: dict[str, Any]) -> dict[str, Any]:
        import mlflow
        import transformers

        config, logger = self.config, self.logger
        client, run_id = logger.experiment, logger.run_id
        if metrics.get("confusion_matrix"):  # None when the test split was empty
            fig = viz.confusion_matrix_figure(metrics["confusion_matrix"], list(config.labels))
            client.log_figure(run_id, fig, "confusion_matrix.png")
        client.log_dict(run_id, metrics, "metrics.json")
        uri = trainer_tracking_uri(config)
        info: dict[str, Any] = {
            "run_id": run_id,
            "experiment_id": logger.experiment_id,
            "tracking_uri": tracking.safe_uri(uri),
            "registered_model_name": None,
            "registered_model_version": None,
        }
        link = tracking.run_url(
            tracking.web_ui(tracking.safe_uri(uri)), logger.experiment_id, run_id
        )
        if link:
            info["run_url"] = link
        if not config.mlflow.log_model:
            return info
        mlflow.set_tracking_uri(uri)
        # The registry is the tracking store: an inherited MLFLOW_REGISTRY_URI must not divert the
        # version.
        mlflow.set_registry_uri(uri)
        name = config.mlflow.registered_model_name
        key = config.mlflow.tags.get(TRAINING_KEY_TAG)
        # a retry of the same inputs + config reuses its version instead of registering another
        if name and key:
            found = mlflow.MlflowClient(uri, registry_uri=uri).search_model_versions(
                f"name = '{name}' and tags.{TRAINING_KEY_TAG} = '{key}'"
            )
            if found:
                version = min(found, key=lambda mv: int(mv.version))
                log.warning(
                    "model already registered for training key %s: reusing %s v%s",
                    key,
                    name,
                    version.version,
                )
                info.update(
                    registered_model_name=name,
                    registered_model_version=int(version.version),
                    model_uri=f"models:/{name}/{version.version}",
                    reused_registration=True,
                )
                return info
        staging = str(self.staging)
        pipe = transformers.pipeline(
            "text-classification", model=staging, tokenizer=staging, device=-1
        )
        with mlflow.start_run(run_id=run_id):
            model_info = mlflow.transformers.log_model(
                transformers_model=pipe,
                name="model",
                task="text-classification",
                # Given, not inferred: inference times out by a signal, which fails on this worker
                # thread (a warning, then mlflow falls back to this same default signature for the
                # task).
                signature=_signature(),
                pip_requirements=[
                    f"transformers=={transformers.__version__}",
                    f"torch=={torch.__version__.split('+')[0]}",
                ],
                input_example=["a fine product"],
            )
        if name:
            # Registered with its tags in one call: a version never exists without the key that
            # finds it again.
            version = mlflow.register_model(
                model_info.model_uri, name, tags=dict(config.mlflow.tags)
            )
            info["registered_model_name"] = name
            info["registered_model_version"] = int(version.version)
        info["model_uri"] = model_info.model_uri
        return info
