"""``tuning_study[v]``: an Optuna study of ``finetuned_model``'s hyper-parameters on a version.

Each trial is a shortened ``finetuned_model`` training through the same launcher (a torchrun
subprocess locally, a gang on Kubernetes), with its own MLflow run nested under the study's run.
The study lives in durable storage (a journal file under the storage root, or a database URL), so a
re-materialization continues it (core/tuning/study.py says how a killed run's trials are recovered).
Published: ``best.json`` (the best trial's parameters, the study's ``fixed`` settings, whether the
study ran to ``n_trials``), which ``finetuned_model`` reads with ``hyper_parameters_from: study``.
Not part of the default run: materialize it when you want to tune.

A database URL with a password never reaches a file: trials get it by environment
(``FINETUNE_ASSETS_STUDY_STORAGE``, or the variable ``storage_url: env:NAME`` names), their trainer
configs say ``env:NAME``.
"""

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import dagster as dg
import fsspec

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.io import tracking
from finetune_assets.core.io.contracts import (
    BEST_FILE,
    FINETUNED_MODEL,
    MDS_SHARDS,
    PRETRAINED_MODEL,
    TRAINER_CONFIG_FILE,
    TUNING_STUDY,
)
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.labels.infer import labels_from_metadata
from finetune_assets.core.launchers.base import TrainingFailed, TrainingLauncher, TrainingSpec
from finetune_assets.core.launchers.local import LocalTorchrunLauncher
from finetune_assets.core.training.config import TrialConfig
from finetune_assets.core.tuning import study as tuning
from finetune_assets.core.tuning.study_storage import ENV_PREFIX, STORAGE_ENV
from finetune_assets.core.tuning.tags import AUTO_TUNE_TAG
from finetune_assets.defs.common import OWNERS, launch_labels, markdown_table, version_of
from finetune_assets.defs.models.finetuned import (
    TRAINING_POOL,
    FinetuneConfig,
    build_trainer_config,
    code_version,
)
from finetune_assets.defs.provenance import read_recorded, run_group_id
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.tuning.space import TuningConfig
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS, dataset_versions

STUDY_DIR = "tuning"  # <root>/tuning/<version>/: the study journal and the trials' scratch folders
OUTCOME_FILE = "outcome.json"  # <root>/tuning/<version>/: how the version's last study run ended


def study_storage(config: TuningConfig, store: Storage, version: str) -> str:
    """The study's storage: the configured database URL, else a journal file under a local root."""
    if config.storage_url:
        return config.storage_url
    if not store.is_local:
        raise dg.Failure(
            f"the storage root {store.url()} is remote: a study journal needs a local file system; "
            "set tuning_study's storage_url to a database URL (postgresql://...)"
        )
    folder = store.url(STUDY_DIR, version)
    os.makedirs(folder, exist_ok=True)
    return f"{folder}/study.journal"


class _Trials:
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
        run_id = self.context.run.run_id
        n = trial.number
        folder = self.store.url(STUDY_DIR, self.version, "trials", f"{n:04d}")
        settings = {
            **self.config.fixed.settings(),
            **params,
            "max_steps": self.config.trial_max_steps,
            "run_name": f"{self.version}-trial-{n}",
        }
        tags = {
            "dataset_version": self.version,
            "code_version": code_version(),
            "dagster_run_id": run_id,
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
                    name=_job_name(self.version, run_id, n),
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


def _labels(context: dg.AssetExecutionContext, store: Storage, version: str) -> list[str]:
    """The version's classes (the shards' label set): a warm start only crosses equal ones."""
    shards = read_recorded(context.instance, store, MDS_SHARDS, version)
    return list(labels_from_metadata(shards.metadata).names)


def _warm_start(
    context: dg.AssetExecutionContext,
    store: Storage,
    version: str,
    labels: list[str],
    config: TuningConfig,
    study: Any,
) -> tuple[str, list[int]] | None:
    """A new study starts from the previous version's best trials: the latest version before this
    one (in the order versions were added) with a published study of the same label set.
    """
    if config.warm_start_trials <= 0:
        return None
    keys = context.instance.get_dynamic_partitions(DATASET_VERSIONS)
    earlier = keys[: keys.index(version)] if version in keys else keys
    for prev in reversed(earlier):
        published = store.current(TUNING_STUDY, prev)
        best = store.read_json(f"{published.url}/{BEST_FILE}") if published else None
        if not best or best.get("labels") != labels:
            continue
        rows = store.read_json(f"{published.url}/trials.json") or []
        numbers = tuning.warm_start(study, config, prev, rows)
        return (prev, numbers) if numbers else None
    return None


def _alive(instance: dg.DagsterInstance) -> Any:
    """Whether a Dagster run still runs (its RUNNING trials are its own, not a dead run's)."""
    done = {
        dg.DagsterRunStatus.SUCCESS,
        dg.DagsterRunStatus.FAILURE,
        dg.DagsterRunStatus.CANCELED,
    }

    def alive(run_id: str) -> bool:
        run = instance.get_run_by_id(run_id)
        return run is not None and run.status not in done

    return alive


def _within_pool(context: dg.AssetExecutionContext, config: TuningConfig) -> TuningConfig:
    """No more trials at once than the ``training`` pool has slots, when the instance limits it.

    The study holds one slot for all its trials (an op cannot claim more); this keeps its gangs
    within what the deployment allows for training at once.
    """
    limits = {p.name: p.limit for p in context.instance.event_log_storage.get_pool_limits()}
    limit = limits.get(TRAINING_POOL)
    if limit and config.parallel_trials > limit:
        context.log.warning(
            f"parallel_trials {config.parallel_trials} > the {TRAINING_POOL} pool's limit "
            f"{limit}: running {limit} trials at once"
        )
        return config.model_copy(update={"parallel_trials": limit})
    return config


def _record_outcome(
    store: Storage,
    version: str,
    context: dg.AssetExecutionContext,
    study: str,
    complete: bool,
    why: str,
) -> None:
    """How this run's study ended, for ``finetune-assets summary`` (a failed study publishes
    nothing, so it is said here).
    """
    body = {"study": study, "complete": complete, "why": why, "dagster_run_id": context.run.run_id}
    store.write_atomic(store.url(STUDY_DIR, version, OUTCOME_FILE), json.dumps(body).encode())


def _job_name(version: str, run_id: str, number: int) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", version.lower()).strip("-")[:30] or "v"
    return f"tune-{slug}-{run_id[:8]}-t{number}"


def _remove(url: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _parent_run(
    context: dg.AssetExecutionContext,
    study: Any,
    mlflow: MlflowResource,
    store: Storage,
    version: str,
) -> str | None:
    """The study's MLflow run (made once, kept in the study), trials nest under it; outages warn."""
    from mlflow.exceptions import MlflowException

    known = study.user_attrs.get(tuning.MLFLOW_RUN)
    if known:
        _set_status(context, mlflow, store, known, "RUNNING")  # resumed: running again
        return known
    try:
        client = mlflow.client(store)
        exp_id = mlflow.experiment_id(store, client)
        run = client.create_run(
            exp_id,
            run_name=f"{version}-study",
            tags={
                "dataset_version": version,
                "model_kind": "tuning_study",
                "tuning_study": study.study_name,
                "dagster_run_id": context.run.run_id,
            },
        )
    except (MlflowException, OSError, ValueError) as err:
        context.log.warning(
            f"tuning_study[{version}]: no MLflow parent run ({err}); trials are logged unnested"
        )
        return None
    study.set_user_attr(tuning.MLFLOW_RUN, run.info.run_id)
    study.set_user_attr("mlflow_experiment_id", str(exp_id))
    return run.info.run_id


def _set_status(
    context: dg.AssetExecutionContext,
    mlflow: MlflowResource,
    store: Storage,
    run_id: str | None,
    status: str,
) -> None:
    """The study's MLflow run's status: RUNNING while a run tunes, then FINISHED / FAILED /
    KILLED with it (never left RUNNING).
    """
    from mlflow.exceptions import MlflowException

    if not run_id:
        return
    try:
        client = mlflow.client(store)
        if status == "RUNNING":
            client.update_run(run_id, status="RUNNING")
        else:
            client.set_terminated(run_id, status=status)
    except (MlflowException, OSError, ValueError) as err:
        context.log.warning(f"study MLflow run {run_id} not set {status}: {err}")


def _log_best(
    context: dg.AssetExecutionContext,
    mlflow: MlflowResource,
    store: Storage,
    run_id: str | None,
    summary: tuning.Summary,
) -> None:
    from mlflow.exceptions import MlflowException

    if not run_id or summary.best is None:
        return
    try:
        client = mlflow.client(store)
        for key, value in summary.best["params"].items():
            client.set_tag(run_id, f"best.{key}", str(value))
        client.set_tag(run_id, "best_trial", str(summary.best["trial"]))
        client.log_metric(run_id, "best_val_macro_f1", float(summary.best["value"]))
        for state, count in summary.counts.items():
            client.log_metric(run_id, f"trials_{state.lower()}", count)
    except (MlflowException, OSError, ValueError) as err:
        context.log.warning(f"study results not logged to MLflow: {err}")


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            TUNING_STUDY,
            deps=[MDS_SHARDS, PRETRAINED_MODEL],
            group_name="models",
            kinds={"optuna", "pytorch", "mlflow"},
            owners=OWNERS,
            code_version="1",
            description="Optuna study of finetuned_model's hyper-parameters (trials trained "
            "through the launcher, pruned early); skipped in runs that also train finetuned_model",
            skippable=True,
        )
    ],
    partitions_def=dataset_versions,
    pool=TRAINING_POOL,  # one study per slot; its trials run inside it (parallel_trials)
)
def tuning_study(
    context: dg.AssetExecutionContext,
    config: TuningConfig,
    storage: StorageResource,
    launcher: TrainingLauncher,
    mlflow: MlflowResource,
) -> Iterator[dg.MaterializeResult]:
    """Tuning is asked for, never a side effect: a whole-graph run (``--select '*'``) trains the
    model with its config and skips the study (``finetuned_model`` reads one only when asked).
    """
    # empty or None: every asset of the job runs
    selected = context.run.asset_selection or context.job_def.asset_layer.selected_asset_keys
    if dg.AssetKey(FINETUNED_MODEL) in selected and not config.in_training_runs:
        context.log.info(
            "tuning_study skipped: this run also trains finetuned_model; materialize tuning_study "
            "on its own to tune (or set in_training_runs)"
        )
        return
    version = version_of(context)
    config = _within_pool(context, config)
    store = storage.storage()
    url = study_storage(config, store, version)
    study = tuning.open_study(config, url, version)
    earlier = tuning.earlier_studies(url, version, study.study_name)
    if earlier:
        context.log.info(
            f"study {study.study_name} (config {config.study_hash()}); the version's studies "
            f"of other configs, kept: {earlier}"
        )
    labels = _labels(context, store, version)
    warmed = _warm_start(context, store, version, labels, config, study)
    if warmed:
        context.log.info(f"warm start: {warmed[0]}'s trials {warmed[1]} are tried first")
    requeued = tuning.recover(study, _alive(context.instance))
    if requeued:
        context.log.warning(
            f"trials {requeued} were left unfinished by a killed run: marked failed, "
            "their parameters enqueued again"
        )
    parent = _parent_run(context, study, mlflow, store, version)
    status = "FAILED"  # what an error leaves; an interruption is KILLED
    try:
        outcome = tuning.optimize(
            config,
            study,
            _Trials(context, config, store, version, launcher, mlflow, url, parent),
            owner=context.run.run_id,
        )
        summary = tuning.summarize(study)
        context.log.info(
            f"{outcome.ran} trials this run ({outcome.failed} failed in training); study: "
            f"{summary.counts}; stopped: {outcome.reason}"
        )
        if summary.best is None:
            why = f"no completed trial ({summary.counts}; stopped: {outcome.reason})"
            _record_outcome(store, version, context, study.study_name, False, why)
            if context.run.tags.get(AUTO_TUNE_TAG) == "true":
                # the new-data sensor's run: the version is then trained with the default recipe
                # (tuned_retrain_sensor), so this run ends without a study, not as a failure
                context.log.warning(
                    f"study {study.study_name} failed: {why}; the version is trained with the "
                    "default recipe"
                )
                return
            raise dg.Failure(
                f"study {study.study_name} has no completed trial ({summary.counts}); "
                "re-materialize to continue it"
            )
        if not outcome.complete:
            context.log.warning(
                f"study {study.study_name} cut short ({outcome.reason}): "
                f"{tuning.finished(study)} of {config.n_trials} trials finished; its best so far "
                "is published with complete: false (the new-data sensor then trains the default "
                "recipe: defs/tuning/on_landing.py)"
            )
        _log_best(context, mlflow, store, parent, summary)
        status = "FINISHED" if outcome.complete else "FAILED"
        _record_outcome(
            store,
            version,
            context,
            study.study_name,
            outcome.complete,
            "" if outcome.complete else f"cut short: {outcome.reason}",
        )
    except (dg.DagsterExecutionInterruptedError, KeyboardInterrupt):
        status = "KILLED"
        raise
    finally:
        _set_status(context, mlflow, store, parent, status)
    best = {
        **summary.best,
        "study_name": study.study_name,
        "config_hash": config.study_hash(),
        "storage": tracking.safe_uri(url),
        "fixed": config.fixed.settings(),
        "labels": labels,
        "complete": outcome.complete,
        "stopped": outcome.reason,
        "finished_trials": tuning.finished(study),
        "failed_in_training": summary.failed_in_training,
    }
    with store.publish(TUNING_STUDY, version) as staging:
        (staging.local_dir / BEST_FILE).write_text(json.dumps(best, indent=2, sort_keys=True))
        (staging.local_dir / "trials.json").write_text(
            json.dumps(summary.rows, indent=2, default=str)
        )
        staging.data_version = hashlib.sha256(
            json.dumps(best, sort_keys=True).encode()
        ).hexdigest()[:16]
        staging.metadata = {"best_trial": best["trial"]}
    meta = _metadata(context, study, summary, best, mlflow, parent)
    meta["earlier_studies"] = dg.MetadataValue.json(earlier)
    yield dg.MaterializeResult(
        asset_key=TUNING_STUDY,
        data_version=dg.DataVersion(staging.data_version),
        metadata=meta,
    )


def _metadata(
    context: dg.AssetExecutionContext,
    study: Any,
    summary: tuning.Summary,
    best: dict[str, Any],
    mlflow: MlflowResource,
    parent: str | None,
) -> dict[str, Any]:
    names = sorted({k for r in summary.rows for k in r["params"]})
    rows = [
        (
            r["number"],
            r["state"].lower(),
            "" if r["value"] is None else f"{r['value']:.4f}",
            "" if r["seconds"] is None else f"{r['seconds']:.0f}",
            r["reports"] or "",
            *(_fmt(r["params"].get(k)) for k in names),
        )
        for r in summary.rows
    ]
    meta: dict[str, Any] = {
        "trials": markdown_table(
            ("trial", "state", "val macro-F1", "seconds", "reports", *names), rows
        ),
        "best_trial": best["trial"],
        "best_val_macro_f1": dg.MetadataValue.float(float(best["value"])),
        "best_params": dg.MetadataValue.json(best["params"]),
        "study": best["study_name"],
        "study_storage": best["storage"],
        "study_complete": best["complete"],
        "study_stopped": best["stopped"],
        "trials_failed_in_training": best["failed_in_training"],
        "fixed": dg.MetadataValue.json(best["fixed"]),
        **{f"trials_{s.lower()}": n for s, n in summary.counts.items() if n},
    }
    try:  # a picture is a nicety: a plotting error must never fail a finished study
        meta["optimization_history"] = dg.MetadataValue.md(
            viz.optimization_history_md(summary.rows)
        )
        importance = tuning.importances(study)
        if importance:
            meta["param_importance"] = dg.MetadataValue.md(viz.param_importance_md(importance))
    except Exception as err:  # any plotting/encoding/importance error
        context.log.warning(f"study charts skipped: {err}")
    exp = study.user_attrs.get("mlflow_experiment_id")
    link = mlflow.run_url(exp, parent) if parent and exp else None
    if link:
        meta["mlflow_run"] = dg.MetadataValue.url(link)
    return meta


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
