"""The study's MLflow run: made once and kept in the study, the trials' runs nest under it; its
status follows the Dagster run's and it carries the best trial. A tracking outage only warns.
"""

# Annotations stay unevaluated: core/tuning/study.py imports this package (defs.tuning.space), so
# while it loads, its names are not there yet.
from __future__ import annotations

from typing import Any

import dagster as dg

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.tuning import study as tuning
from finetune_assets.defs.resources.mlflow import MlflowResource


def parent_run(
    context: dg.AssetExecutionContext,
    study: Any,
    mlflow: MlflowResource,
    store: Storage,
    version: str,
) -> str | None:
    """The study's MLflow run (made once, kept in the study), trials nest under it; outages warn."""
    known = study.user_attrs.get(tuning.MLFLOW_RUN)
    if known:
        set_status(context, mlflow, store, known, "RUNNING")  # resumed: running again
        return known
    tags = {
        "dataset_version": version,
        "model_kind": "tuning_study",
        "tuning_study": study.study_name,
        "dagster_run_id": context.run.run_id,
    }
    try:
        _, run = mlflow.create_run(store, f"{version}-study", tags)
    except mlflow.outage_errors() as err:
        context.log.warning(
            f"tuning_study[{version}]: no MLflow parent run ({err}); trials are logged unnested"
        )
        return None
    study.set_user_attr(tuning.MLFLOW_RUN, run.info.run_id)
    study.set_user_attr("mlflow_experiment_id", str(run.info.experiment_id))
    return run.info.run_id


def set_status(
    context: dg.AssetExecutionContext,
    mlflow: MlflowResource,
    store: Storage,
    run_id: str | None,
    status: str,
) -> None:
    """The study's MLflow run's status: RUNNING while a run tunes, then FINISHED / FAILED /
    KILLED with it (never left RUNNING).
    """
    if not run_id:
        return
    try:
        client = mlflow.client(store)
        if status == "RUNNING":
            client.update_run(run_id, status="RUNNING")
        else:
            client.set_terminated(run_id, status=status)
    except mlflow.outage_errors() as err:
        context.log.warning(f"study MLflow run {run_id} not set {status}: {err}")


def log_best(
    context: dg.AssetExecutionContext,
    mlflow: MlflowResource,
    store: Storage,
    run_id: str | None,
    summary: tuning.Summary,
) -> None:
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
    except mlflow.outage_errors() as err:
        context.log.warning(f"study results not logged to MLflow: {err}")
