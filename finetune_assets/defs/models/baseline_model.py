"""``baseline_model[v]``: the TF-IDF + logistic-regression baseline of one dataset version, in
seconds on CPU.

Same train split and same frozen test split as ``finetuned_model[v]`` (the ``split`` column of
``raw_reviews``), so its scores are the bar the fine-tuned model must clear (the quality gate
reads them). Tracked as its own MLflow run (tag ``model_kind=baseline``) beside the fine-tuned runs.
"""

import time
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.evaluation.baseline import (
    INFO_FILE,
    MODEL_FILE,
    BaselineModel,
    BaselineSettings,
)
from finetune_assets.core.evaluation.evaluate import majority_scores, order_labels
from finetune_assets.core.io.contracts import BASELINE_MODEL, RAW_REVIEWS, SPLITS, read_reviews
from finetune_assets.core.io.storage import Storage, hash_tree
from finetune_assets.defs.common import markdown_table, version_asset, version_of
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource


class BaselineConfig(dg.Config):
    """The baseline's recipe (``finetune_assets.core.evaluation.baseline.BaselineSettings``)."""

    class_weight: str = Field(
        "balanced", description="balanced (like the fine-tuned default) or none"
    )
    C: float = Field(
        4.0, description="inverse L2 regularization strength of the logistic regression"
    )
    word_ngram_max: int = Field(2, description="word n-grams 1..N")
    char_ngram_min: int = Field(
        2, description="character n-grams (within word boundaries) from ..."
    )
    char_ngram_max: int = Field(5, description="... to this length")
    min_df: int = Field(2, description="ignore n-grams seen in fewer training reviews")
    max_features: int = Field(200_000, description="largest vocabulary per analyzer (word, char)")

    def settings(self) -> BaselineSettings:
        return BaselineSettings(
            word_ngrams=(1, self.word_ngram_max),
            char_ngrams=(self.char_ngram_min, self.char_ngram_max),
            min_df=self.min_df,
            max_features=self.max_features,
            C=self.C,
            class_weight=None if self.class_weight == "none" else self.class_weight,
        )


def split_reviews(store: Storage, version: str) -> dict[str, tuple[list[str], list[str]]]:
    """(texts, labels) per split, from the split column ``raw_reviews`` stored beside each
    review.
    """
    reviews = read_reviews(
        store.require(RAW_REVIEWS, version).url, store.fs, columns=["text", "label", "split"]
    )
    splits = reviews.column("split").cast(pa.string())
    out = {}
    for split in SPLITS:
        part = reviews.filter(pc.equal(splits, split))
        out[split] = (part.column("text").to_pylist(), part.column("label").to_pylist())
    return out


@version_asset("models", {"scikitlearn", "mlflow"}, deps=[RAW_REVIEWS], code_version="1")
def baseline_model(
    context: dg.AssetExecutionContext,
    config: BaselineConfig,
    storage: StorageResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """TF-IDF word + char n-grams with logistic regression: the bar finetuned_model must beat on
    the same test split.
    """
    version = version_of(context)
    store = storage.storage()
    parts = split_reviews(store, version)
    (train_x, train_y), (test_x, test_y) = parts["train"], parts["test"]
    label_set = order_labels([*train_y, *parts["validation"][1], *test_y])
    started = time.time()
    try:
        model = BaselineModel.fit(train_x, train_y, config.settings(), label_set=label_set)
    except ValueError as err:
        raise dg.Failure(
            f"baseline_model[{version}]: {err}; add reviews of the missing classes"
        ) from err
    fit_seconds = time.time() - started
    test = model.evaluate(test_x, test_y) if test_x else None
    majority = majority_scores(train_y, test_y, label_set) if test_x else None
    info = {
        "dataset_version": version,
        "settings": config.model_dump(),
        "fit_seconds": round(fit_seconds, 3),
        "rows": {"train": len(train_x), "test": len(test_x)},
        "test": test,
        "majority": majority,
    }
    with store.publish(BASELINE_MODEL, version) as staging:
        model.save(staging.local_dir, info)
        staging.data_version = hash_tree(staging.local_dir, exclude=(INFO_FILE,))
        staging.metadata = {
            "labels": model.labels,
            **({"macro_f1": test["macro_f1"], "accuracy": test["accuracy"]} if test else {}),
        }
        run = _log_mlflow(context, mlflow, store, version, info, staging.local_dir)
        # for benchmark_scores' metrics (baseline.json is outside the data version)
        if run.get("run_id"):
            model.save_info(staging.local_dir, {**info, "mlflow_run_id": run["run_id"]})
    return dg.MaterializeResult(
        metadata=_metadata(info, model.labels, staging.url, run, mlflow),
        data_version=dg.DataVersion(staging.data_version),
    )


def read_baseline_info(store: Storage, version: str) -> dict | None:
    """The published ``baseline.json`` of a version (test scores, labels), or None if never
    materialized.
    """
    published = store.current(BASELINE_MODEL, version)
    return None if published is None else store.read_json(f"{published.url}/{INFO_FILE}")


def _metadata(
    info: dict, labels: list[str], url: str, run: dict, mlflow: MlflowResource
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "path": dg.MetadataValue.path(f"{url}/{MODEL_FILE}"),
        "labels": ", ".join(labels),
        "train_reviews": info["rows"]["train"],
        "test_samples": info["rows"]["test"],
        "fit_seconds": dg.MetadataValue.float(info["fit_seconds"]),
    }
    test, majority = info["test"], info["majority"]
    if test is None:
        meta["test"] = "skipped: empty test split"
    else:
        meta.update(
            {
                "accuracy": dg.MetadataValue.float(test["accuracy"]),
                "macro_f1": dg.MetadataValue.float(test["macro_f1"]),
                "majority_accuracy": dg.MetadataValue.float(majority["accuracy"]),
                "majority_macro_f1": dg.MetadataValue.float(majority["macro_f1"]),
                "f1_per_class": markdown_table(
                    ("class", "F1"), [(k, f"{v:.4f}") for k, v in test["f1_per_class"].items()]
                ),
                "confusion_matrix": dg.MetadataValue.json(
                    {"rows_true_cols_pred": test["confusion_matrix"], "labels": labels}
                ),
            }
        )
        try:
            meta["confusion_matrix_chart"] = dg.MetadataValue.md(
                viz.confusion_matrix_md(test["confusion_matrix"], labels)
            )
        except Exception as err:  # a picture never fails a finished fit
            dg.get_dagster_logger().warning(f"confusion matrix chart skipped: {err}")
    if run.get("run_id"):
        meta["mlflow_run_id"] = run["run_id"]
        link = mlflow.run_url(run["experiment_id"], run["run_id"])
        if link:
            meta["mlflow_run"] = dg.MetadataValue.url(link)
    return meta


def _log_mlflow(
    context, mlflow: MlflowResource, store: Storage, version: str, info: dict, folder
) -> dict:
    """One MLflow run per baseline fit, in the fine-tuned runs' experiment; a tracking outage
    only warns.
    """
    tags = {
        "dataset_version": version,
        "model_kind": "baseline",
        "dagster_run_id": context.run.run_id,
    }
    try:
        client, run = mlflow.create_run(store, f"{version}-baseline", tags)
        rid = run.info.run_id
        for key, value in info["settings"].items():
            client.log_param(rid, key, value)
        if info["test"]:
            client.log_metric(rid, "test_accuracy", info["test"]["accuracy"])
            client.log_metric(rid, "test_macro_f1", info["test"]["macro_f1"])
            for name, value in info["test"]["f1_per_class"].items():
                client.log_metric(rid, f"test_f1_{name}", value)
        client.log_metric(rid, "fit_seconds", info["fit_seconds"])
        client.log_artifacts(rid, str(folder), "baseline_model")
        client.set_terminated(rid)
        return {"run_id": rid, "experiment_id": str(run.info.experiment_id)}
    except mlflow.outage_errors() as err:
        context.log.warning(
            f"baseline_model[{version}]: not logged to MLflow ({err}); the model is published"
        )
        return {}
