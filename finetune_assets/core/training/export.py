"""The trained model out of the trainer: a Hugging Face folder, logged and registered in MLflow,
published under ``output_dir/model``.

:class:`HuggingFaceCheckpointer` exports at the end of fit (every rank takes part in gathering the
weights, rank 0 saves them); ``train()`` then calls :meth:`~HuggingFaceCheckpointer.publish` once
the test metrics exist. Modelled on llm-foundry's ``HuggingFaceCheckpointer`` (which also exports at
fit end and registers to MLflow). mlflow is imported where it is used: only rank 0 logs, once,
after training.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.io import tracking
from finetune_assets.core.training.checkpoints import trainer_files as files
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.module import export_classifier

log = logging.getLogger("finetune_assets.core.training")

# model-version tag: hash of the run's inputs + config (idempotent registration)
TRAINING_KEY_TAG = "training_inputs"


def trainer_tracking_uri(config: TrainerConfig) -> str:
    """The run's MLflow store: the rule of :mod:`finetune_assets.core.io.tracking`, embedded beside
    a local output.
    """
    return tracking.tracking_uri(
        config.mlflow.tracking_uri,
        files.local_path(config.output_dir),
        "set mlflow.tracking_uri (or MLFLOW_TRACKING_URI)",
    )


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
    # lazy: rank 0 only, after training
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


def registered_version(uri: str, name: str | None, key: str | None) -> Any | None:
    """The model version a run of the same inputs + config registered before (the oldest), if any:
    a retry reuses it instead of registering another.
    """
    if not (name and key):
        return None
    import mlflow  # lazy: rank 0 only, after training

    found = mlflow.MlflowClient(uri, registry_uri=uri).search_model_versions(
        f"name = '{name}' and tags.{TRAINING_KEY_TAG} = '{key}'"
    )
    return min(found, key=lambda mv: int(mv.version)) if found else None


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
        import mlflow  # lazy: rank 0 only, after training

        config = self.config
        uri = trainer_tracking_uri(config)
        info = self._log_run_files(metrics, uri)
        if not config.mlflow.log_model:
            return info
        mlflow.set_tracking_uri(uri)
        # The registry is the tracking store: an inherited MLFLOW_REGISTRY_URI must not divert the
        # version.
        mlflow.set_registry_uri(uri)
        name = config.mlflow.registered_model_name
        key = config.mlflow.tags.get(TRAINING_KEY_TAG)
        version = registered_version(uri, name, key)
        if version is not None:
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
        model_uri = self._log_transformers_model()
        if name:
            # Registered with its tags in one call: a version never exists without the key that
            # finds it again.
            version = mlflow.register_model(model_uri, name, tags=dict(config.mlflow.tags))
            info["registered_model_name"] = name
            info["registered_model_version"] = int(version.version)
        info["model_uri"] = model_uri
        return info

    def _log_run_files(self, metrics: dict[str, Any], uri: str) -> dict[str, Any]:
        """The confusion matrix and ``metrics.json`` into the run; what identifies the run (its
        link where the store has a web UI), the registration still empty.
        """
        config, logger = self.config, self.logger
        client, run_id = logger.experiment, logger.run_id
        if metrics.get("confusion_matrix"):  # None when the test split was empty
            fig = viz.confusion_matrix_figure(metrics["confusion_matrix"], list(config.labels))
            client.log_figure(run_id, fig, "confusion_matrix.png")
        client.log_dict(run_id, metrics, "metrics.json")
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
        return info

    def _log_transformers_model(self) -> str:
        """The staged folder as a transformers-flavor model in the run; its model URI."""
        # lazy: rank 0 only, after training
        import mlflow
        import transformers

        staging = str(self.staging)
        pipe = transformers.pipeline(
            "text-classification", model=staging, tokenizer=staging, device=-1
        )
        with mlflow.start_run(run_id=self.logger.run_id):
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
        return model_info.model_uri
