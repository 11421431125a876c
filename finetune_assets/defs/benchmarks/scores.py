"""``benchmark_scores[v]``: the fine-tuned model and the baseline of version ``v`` scored on every
benchmark set.

Benchmark sets (``finetune-assets benchmarks add``) are labelled files that never train. The
metadata holds this version's scores and a table across every version scored so far (one row per
version and set), and the scores are logged as metrics (``bench_{set}_accuracy`` / ``_macro_f1``) on
the version's MLflow runs. A set whose labels the model cannot predict is refused by name in the
table, never scored on a subset.
"""

import json
from pathlib import Path
from typing import Any

import dagster as dg

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.evaluation.baseline import BaselineModel
from finetune_assets.core.evaluation.benchmark_sets import list_benchmark_sets, read_benchmark_set
from finetune_assets.core.evaluation.evaluate import LabelSetMismatch, map_labels, scores
from finetune_assets.core.evaluation.inference import Classifier
from finetune_assets.core.io.contracts import BASELINE_MODEL, FINETUNED_MODEL
from finetune_assets.core.io.storage import Storage, hash_tree
from finetune_assets.defs.common import version_asset, version_of
from finetune_assets.defs.models.baseline_model import read_baseline_info
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource

SCORES = "benchmark_scores"
SCORES_FILE = "scores.json"


def score_on_set(classifier, bench, batch_size: int = 32, max_length: int = 512) -> dict:
    """Scores of one classifier on one set, or ``{"refused": reason}`` when the label sets do not
    match.
    """
    try:
        truth = map_labels(
            bench.labels,
            bench.info.get("label_mapping"),
            classifier.labels,
            where=f"benchmark set {bench.name}",
        )
    except LabelSetMismatch as err:
        return {"refused": str(err)}
    predicted = classifier.predict_labels(bench.texts, max_length, batch_size)
    result = scores(truth, predicted, classifier.labels)
    return {
        k: result[k]
        for k in ("samples", "accuracy", "macro_f1", "f1_per_class", "confusion_matrix", "labels")
    }


# scored by automation once its model (behind the gate) and baseline exist (defs/automation.py)
@version_asset("models", {"mlflow"}, deps=[FINETUNED_MODEL, BASELINE_MODEL], code_version="1")
def benchmark_scores(
    context: dg.AssetExecutionContext, storage: StorageResource, mlflow: MlflowResource
) -> dg.MaterializeResult:
    """Fine-tuned model and baseline of this version scored on every registered benchmark set
    (never trained on).
    """
    version = version_of(context)
    store = storage.storage()
    names = list_benchmark_sets(store)
    finetuned = store.require(FINETUNED_MODEL, version)
    baseline = store.require(BASELINE_MODEL, version)
    results: dict[str, dict[str, Any]] = {}
    if names:
        with store.local_copy(finetuned.url) as ft_dir, store.local_copy(baseline.url) as bl_dir:
            models = {
                "finetuned": Classifier.from_folder(Path(ft_dir)),
                "baseline": BaselineModel.load(Path(bl_dir)),
            }
            for name in names:
                bench = read_benchmark_set(store, name)
                results[name] = {
                    "set_data_version": bench.info["data_version"],
                    "rows": len(bench.texts),
                    **{kind: score_on_set(m, bench) for kind, m in models.items()},
                }
                context.log.info(f"benchmark {name}: {_row_cells(results[name])}")
    else:
        context.log.info(
            "no benchmark sets registered (finetune-assets benchmarks add NAME --source FILE)"
        )
    with store.publish(SCORES, version) as staging:
        (staging.local_dir / SCORES_FILE).write_text(json.dumps(results, indent=2))
        staging.data_version = hash_tree(staging.local_dir)
        staging.metadata = {"sets": names}
    _log_mlflow(context, mlflow, store, version, finetuned, results)
    return dg.MaterializeResult(
        metadata={
            "sets": len(names),
            "scores": dg.MetadataValue.md(
                _table({version: results})
                if names
                else "no benchmark sets registered: `finetune-assets benchmarks add NAME "
                "--source FILE`"
            ),
            "across_versions": dg.MetadataValue.md(_table(_all_versions(store)) or "none"),
            "path": dg.MetadataValue.path(f"{staging.url}/{SCORES_FILE}"),
        },
        data_version=dg.DataVersion(staging.data_version),
    )


def _cell(result: dict) -> str:
    if "refused" in result:
        return "refused: labels do not match"
    return f"{result['accuracy']:.4f} / {result['macro_f1']:.4f}"


def _row_cells(entry: dict) -> str:
    return (
        f"fine-tuned {_cell(entry['finetuned'])}, baseline {_cell(entry['baseline'])} "
        "(accuracy / macro-F1)"
    )


def _table(by_version: dict[str, dict]) -> str:
    rows = [
        (v, name, entry)
        for v, sets in sorted(by_version.items())
        for name, entry in sorted(sets.items())
    ]
    if not rows:
        return ""
    lines = [
        viz.markdown_table(
            (
                "version",
                "benchmark set",
                "rows",
                "fine-tuned acc / macro-F1",
                "baseline acc / macro-F1",
            ),
            [
                (v, name, e["rows"], _cell(e["finetuned"]), _cell(e["baseline"]))
                for v, name, e in rows
            ],
        )
    ]
    refusals = {
        f"{name} ({kind})": e[kind]["refused"]
        for _, name, e in rows
        for kind in ("finetuned", "baseline")
        if "refused" in e[kind]
    }
    lines += [f"\n{k}: {why}" for k, why in sorted(refusals.items())]
    return "\n".join(lines)


def _all_versions(store: Storage) -> dict[str, dict]:
    base = store.url(SCORES)
    if not store.fs.exists(base):
        return {}
    out = {}
    for entry in store.fs.ls(base, detail=False):
        v = entry.rstrip("/").rsplit("/", 1)[-1]
        published = store.current(SCORES, v) if not v.startswith(".") else None
        if published is not None:
            out[v] = store.read_json(f"{published.url}/{SCORES_FILE}") or {}
    return out


def _log_mlflow(
    context, mlflow: MlflowResource, store: Storage, version: str, finetuned, results: dict
) -> None:
    """Benchmark metrics on the fine-tuned run and on the baseline run of this version (when they
    exist).
    """
    run_ids = {
        "finetuned": ((finetuned.metadata or {}).get("mlflow") or {}).get("run_id"),
        "baseline": (read_baseline_info(store, version) or {}).get("mlflow_run_id"),
    }
    if not results or not any(run_ids.values()):
        return
    try:
        client = mlflow.client(store)
        for kind, run_id in run_ids.items():
            if not run_id:
                continue
            for name, entry in results.items():
                if "refused" not in entry[kind]:
                    client.log_metric(run_id, f"bench_{name}_accuracy", entry[kind]["accuracy"])
                    client.log_metric(run_id, f"bench_{name}_macro_f1", entry[kind]["macro_f1"])
    except mlflow.outage_errors() as err:
        context.log.warning(f"benchmark scores not logged to MLflow ({err}); they are published")
