"""``tuning_study[v]``: an Optuna study of ``finetuned_model``'s hyper-parameters on a version.

Each trial is a shortened ``finetuned_model`` training through the same launcher (a torchrun
subprocess locally, a gang on Kubernetes, :mod:`.trials`), with its own MLflow run nested under the
study's run (:mod:`.study_mlflow`).
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
from collections.abc import Iterator
from typing import Any

import dagster as dg

from finetune_assets.core.io import tracking
from finetune_assets.core.io.contracts import (
    BEST_FILE,
    FINETUNED_MODEL,
    MDS_SHARDS,
    PRETRAINED_MODEL,
    TUNING_STUDY,
)
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.labels.infer import labels_from_metadata
from finetune_assets.core.tuning import study as tuning
from finetune_assets.core.tuning.tags import AUTO_TUNE_TAG
from finetune_assets.defs.common import OWNERS, version_of
from finetune_assets.defs.models.finetuned import TRAINING_POOL
from finetune_assets.defs.provenance import read_recorded
from finetune_assets.defs.resources.launchers import TrainingLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.tuning.space import TuningConfig
from finetune_assets.defs.tuning.study_mlflow import log_best, parent_run, set_status
from finetune_assets.defs.tuning.study_report import study_metadata
from finetune_assets.defs.tuning.trials import STUDY_DIR, Trials
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS, dataset_versions

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
    study, earlier, labels = _open(context, config, store, url, version)
    parent = parent_run(context, study, mlflow, store, version)
    trials = Trials(context, config, store, version, launcher, mlflow, url, parent)
    ran = _optimize(context, config, study, trials, mlflow, store, version, parent)
    if ran is None:
        return  # no completed trial in a run tuning_automation made (see _optimize)
    outcome, summary = ran
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
    meta = study_metadata(context, study, summary, best, mlflow, parent)
    meta["earlier_studies"] = dg.MetadataValue.json(earlier)
    yield dg.MaterializeResult(
        asset_key=TUNING_STUDY,
        data_version=dg.DataVersion(staging.data_version),
        metadata=meta,
    )


def _open(
    context: dg.AssetExecutionContext, config: TuningConfig, store: Storage, url: str, version: str
) -> tuple[Any, list, list[str]]:
    """The version's study for this config, warm-started and with a killed run's trials recovered;
    the version's studies of other configs, and its label set.
    """
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
    return study, earlier, labels


def _optimize(
    context: dg.AssetExecutionContext,
    config: TuningConfig,
    study: Any,
    trials: Trials,
    mlflow: MlflowResource,
    store: Storage,
    version: str,
    parent: str | None,
) -> tuple[Any, Any] | None:
    """This run's trials, then the study's outcome and summary; the MLflow run's status follows.

    None: no trial completed in a run ``tuning_automation`` made, which then ends without a study
    (``tuned_retrain_sensor`` trains the default recipe); elsewhere that fails the run.
    """
    status = "FAILED"  # what an error leaves; an interruption is KILLED
    try:
        outcome = tuning.optimize(config, study, trials, owner=context.run.run_id)
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
                return None
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
        log_best(context, mlflow, store, parent, summary)
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
        set_status(context, mlflow, store, parent, status)
    return outcome, summary


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
