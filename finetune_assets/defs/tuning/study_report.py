"""What a finished study shows in the UI: its trials as a table, the best trial, charts of the
optimization history and of the parameters' importance, and the link to its MLflow run.
"""

# Annotations stay unevaluated: core/tuning/study.py imports this package (defs.tuning.space), so
# while it loads, its names are not there yet.
from __future__ import annotations

from typing import Any

import dagster as dg

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.tuning import study as tuning
from finetune_assets.defs.common import markdown_table
from finetune_assets.defs.resources.mlflow import MlflowResource


def study_metadata(
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
