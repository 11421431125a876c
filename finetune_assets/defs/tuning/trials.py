"""One trial of a study: a ``finetuned_model`` trainer config cut to the study's budget, launched
through the training launcher (a torchrun subprocess locally, a gang on Kubernetes), its MLflow run
nested under the study's.
"""

import os
import re
import threading
from typing import Any

import dagster as dg
import fsspec

from finetune_assets.core.io import tracking
from finetune_assets.core.io.contracts import MDS_SHARDS, TRAINER_CONFIG_FILE, TUNING_STUDY
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.launchers.base import TrainingFailed, TrainingSpec
from finetune_assets.core.training.config import TrialConfig
from finetune_assets.core.training.trial.study_storage import ENV_PREFIX, STORAGE_ENV
from finetune_assets.core.tuning import study as tuning
from finetune_assets.defs.common import launch_labels
from finetune_assets.defs.models.finetuned import FinetuneConfig, build_trainer_config, code_version
from finetune_assets.defs.provenance import read_recorded, run_group_id
from finetune_assets.defs.resources.launchers import LocalTorchrunLauncher, TrainingLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.tuning.space import TuningConfig

STUDY_DIR = "tuning"  # <root>/tuning/<version>/: the study journal and the trials' scratch folders


class Trials:
    """Runs one trial: a ``finetuned_model`` trainer config cut to the study's budget, launched."""

    def __init__(
        self,
        context: dg.AssetExecutionContext,
        config: TuningConfig,
        store: Storage,
        version: str,
        launcher: TrainingLauncher,
        mlflow: MlflowResource,
        storage: str,
        parent_run: str | None,
    ):
        self.context, self.config, self.store, self.version = context, config, store, version
        # the shards Dagster recorded and the base model the run group pinned: every trial trains
        # on exactly what finetuned_model would
        self.shards = read_recorded(context.instance, store, MDS_SHARDS, version)
        self.pin_id = run_group_id(context.run)
        self.launcher, self.mlflow = launcher, mlflow
        self.storage, self.parent_run = storage, parent_run
        # what trials are told: the URL itself only when it carries no credentials
        self.trial_storage, self.env = _trial_storage(storage)
        self._lock = threading.Lock()  # parallel trials (threads) write their configs one at a time

    def __call__(self, trial: Any, params: dict[str, Any]) -> None:
        n = trial.number
        folder = self.store.url(STUDY_DIR, self.version, "trials", f"{n:04d}")
        config_url = self._write_config(trial, params, folder)
        self.context.log.info(f"trial {n}: {params}")
        labels = {
            **launch_labels(self.context, TUNING_STUDY, self.version),
            # a gang per trial: the k8s launcher replaces a live gang of the same asset+partition
            "dagster/partition": f"{self.version}.trial-{n}",
        }
        try:
            self.launcher.launch(
                self.context,
                TrainingSpec(
                    name=_job_name(self.version, self.context.run.run_id, n),
                    config_url=config_url,
                    labels=labels,
                    env=self._env(),
                ),
            )
        except TrainingFailed as err:
            self.context.log.warning(f"trial {n} failed: {str(err)[:2000]}")
            raise tuning.TrainingFailedTrial(str(err)) from err
        finally:
            # a trial's weights are not kept (the winner is retrained)
            _remove(f"{folder}/output/model")
            _remove(f"{folder}/checkpoints")

    def _write_config(self, trial: Any, params: dict[str, Any], folder: str) -> str:
        """The trial's trainer config file (its URL): ``finetuned_model``'s with the study's fixed
        settings and this trial's parameters, cut to the trial budget, reporting to the study.
        """
        n = trial.number
        settings = {
            **self.config.fixed.settings(),
            **params,
            "max_steps": self.config.trial_max_steps,
            "run_name": f"{self.version}-trial-{n}",
        }
        tags = {
            "dataset_version": self.version,
            "code_version": code_version(),
            "dagster_run_id": self.context.run.run_id,
            "tuning_study": trial.study.study_name,
            "trial_number": str(n),
            **{f"trial_param.{k}": str(v) for k, v in params.items()},
        }
        if self.parent_run:  # nested under the study's run in the MLflow UI
            tags["mlflow.parentRunId"] = self.parent_run
        with self._lock:
            trainer, _, _ = build_trainer_config(
                FinetuneConfig(**settings),
                self.store,
                self.shards,
                self.version,
                self.mlflow,
                f"{folder}/output",
                tags,
                run_name=settings["run_name"],
                pin_id=self.pin_id,
            )
            trainer = trainer.model_copy(
                update={
                    "checkpoint_dir": f"{folder}/checkpoints",  # per trial: a retry trains afresh
                    "trial": TrialConfig(
                        storage=self.trial_storage,
                        study_name=trial.study.study_name,
                        trial_id=trial._trial_id,
                        reports=self.config.reports_per_trial,
                        pruner=self.config.pruner_config(),
                    ),
                    "mlflow": trainer.mlflow.model_copy(
                        update={"log_model": False, "registered_model_name": None}
                    ),
                }
            )
            config_url = f"{folder}/{TRAINER_CONFIG_FILE}"
            self.store.fs.makedirs(folder, exist_ok=True)
            with fsspec.open(config_url, "w") as f:
                f.write(trainer.to_json())
        return config_url

    def _env(self) -> dict[str, str]:
        """The storage URL when it has credentials; parallel local trials share this machine's
        cores instead of each taking all of them.
        """
        env = dict(self.env)
        if isinstance(self.launcher, LocalTorchrunLauncher) and self.config.parallel_trials > 1:
            per = self.config.parallel_trials * self.launcher.nproc_per_node
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // per))
        return env


def _trial_storage(url: str) -> tuple[str, dict[str, str]]:
    """The storage string a trial's config file carries, and the environment that resolves it.

    ``env:NAME`` goes as it is (the trainer's environment has NAME: locally inherited, on k8s a
    Secret in ``env_secret_names``); a URL with a password goes by ``FINETUNE_ASSETS_STUDY_STORAGE``
    (the k8s launcher refuses a credential in plain env: use ``env:NAME`` there).
    """
    if url.startswith(ENV_PREFIX) or tracking.safe_uri(url) == url:
        return url, {}
    return f"{ENV_PREFIX}{STORAGE_ENV}", {STORAGE_ENV: url}


def _job_name(version: str, run_id: str, number: int) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", version.lower()).strip("-")[:30] or "v"
    return f"tune-{slug}-{run_id[:8]}-t{number}"


def _remove(url: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)
