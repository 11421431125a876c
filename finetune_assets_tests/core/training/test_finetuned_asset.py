"""``finetuned_model`` materialized through Dagster with the local torchrun launcher on fixture
shards.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from finetune_assets.core.io.contracts import TrainingResult
from finetune_assets.core.io.storage import Storage, hash_tree
from finetune_assets.defs.models.finetuned import finetuned_model
from finetune_assets.defs.resources.launchers import LocalTorchrunLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets_tests.core.training.fixtures import publish_upstream

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_materialize_finetuned_model(storage_root, instance, tiny_model_dir, arabic_reviews):
    """Two DDP ranks through the graph; throughput is reported per device and for all ranks."""
    store = Storage(str(storage_root))
    publish_upstream(store, "v1", tiny_model_dir, arabic_reviews / "PROD.csv")
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    run_config = dg.RunConfig(
        ops={
            "finetuned_model": {
                "config": {
                    "epochs": 1,
                    "accelerator": "cpu",
                    "num_workers": 0,
                    "checkpoint_every_n_steps": 5,
                    "log_every_n_steps": 2,
                }
            }
        }
    )
    result = dg.materialize(
        [finetuned_model],
        partition_key="v1",
        instance=instance,
        run_config=run_config,
        resources={
            "storage": StorageResource(root=str(storage_root)),
            "launcher": LocalTorchrunLauncher(nproc_per_node=2, cwd=str(REPO)),
            "mlflow": MlflowResource(ui_base_url="http://mlflow.example:5000"),
        },
    )
    assert result.success
    mat = result.asset_materializations_for_node("finetuned_model")[0]
    meta = mat.metadata
    assert 0.0 <= meta["accuracy"].value <= 1.0 and "macro_f1" in meta and "f1_Mixed" in meta
    assert meta["samples_seen"].value == 96
    # precision "auto", as resolved where it trained
    assert meta["precision"].value in (
        "bf16-mixed",
        "32-true",
    )
    assert meta["registered_model"].value == "review-classifier v1"
    assert meta["mlflow_run"].value.startswith("http://mlflow.example:5000/#/experiments/")
    assert meta["confusion_matrix_chart"].value.startswith(
        "![confusion matrix](data:image/png;base64,"
    )
    assert meta["test_samples"].value == 24
    # best-validation selection (one epoch here: its own weights) and the curve, also in MLflow
    assert meta["selected_weights"].value == "best" and meta["best_epoch"].value == 1
    assert meta["early_stopped"].value is False
    assert f"| 1 | {meta['global_step'].value} |" in meta["validation_curve"].value
    from mlflow import MlflowClient

    run = MlflowClient(f"sqlite:///{storage_root}/mlflow/mlflow.db").get_run(
        meta["mlflow_run_id"].value
    )
    assert run.data.metrics["selection/best_epoch"] == 1
    assert run.data.metrics["selection/early_stopped"] == 0

    published = store.require("finetuned_model", "v1")
    assert mat.tags["dagster/data_version"] == published.data_version
    assert meta["model_path"].value == f"{published.url}/model"
    model_dir = Path(published.url) / "model"
    assert published.data_version == hash_tree(model_dir)
    trainer_cfg = json.loads((Path(published.url) / "trainer_config.json").read_text())
    assert trainer_cfg["mlflow"]["tracking_uri"] == f"sqlite:///{storage_root}/mlflow/mlflow.db"
    assert trainer_cfg["mlflow"]["tags"]["dataset_version"] == "v1"
    assert trainer_cfg["checkpoint_dir"].startswith(
        f"{storage_root}/finetuned_model/v1/checkpoints/"
    )
    assert (
        storage_root / "mlflow" / "artifacts"
    ).is_dir()  # artifacts under the root, not ./mlruns

    # Lightning ThroughputMonitor's split: all ranks ~ 2 x one device (not one device's peak
    # divided into the whole job's FLOP/s)
    from mlflow import MlflowClient

    client = MlflowClient(trainer_cfg["mlflow"]["tracking_uri"])
    logged = client.get_run(meta["mlflow_run_id"].value).data.metrics
    for key in ("samples_per_sec", "flops_per_sec", "tokens_per_sec", "padded_tokens_per_sec"):
        assert logged[f"device/{key}"] > 0 and f"throughput/{key}" in logged
    ratio = logged["throughput/flops_per_sec"] / logged["device/flops_per_sec"]
    assert 1.5 <= ratio <= 2.5
    assert logged["throughput/padded_tokens_per_sec"] >= logged["throughput/tokens_per_sec"]
    assert meta["throughput_device_flops_per_sec"].value == pytest.approx(
        meta["throughput_flops_per_sec"].value / 2
    )


def _metrics(**overrides) -> TrainingResult:
    metrics = {
        "accuracy": 0.5,
        "macro_f1": 0.4,
        "f1_per_class": {"Positive": 0.6, "Negative": 0.4, "Mixed": 0.2},
        "confusion_matrix": [[3, 1, 0], [1, 2, 0], [0, 1, 1]],
        "test_samples": 9,
        "samples_seen": 96,
        "tokens_seen": 960,
        "train_seconds": 9.6,
        "samples_per_sec": 10.0,
        "tokens_per_sec": 100.0,
        "global_step": 12,
        "epochs": 1,
        "world_size": 1,
        "labels": ["Positive", "Negative", "Mixed"],
        "wall_seconds": 12.0,
    }
    return TrainingResult(**{**metrics, **overrides})


def test_a_plotting_error_never_fails_the_materialization(monkeypatch, caplog):
    from finetune_assets.core.evaluation import charts as viz
    from finetune_assets.defs.models.finetuned import _metadata

    def broken(*args, **kwargs):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(viz, "confusion_matrix_md", broken)
    meta = _metadata(_metrics(), MlflowResource(), "/root/x", "abc")
    assert "confusion_matrix_chart" not in meta and meta["macro_f1"].value == 0.4
    assert "confusion matrix chart skipped: no fonts" in caplog.text


def test_an_untested_model_says_so_in_its_metadata():
    from finetune_assets.defs.models.finetuned import _metadata

    skipped = "test split /x/test is empty: the model was trained but not tested"
    meta = _metadata(
        _metrics(
            accuracy=None,
            macro_f1=None,
            f1_per_class={},
            confusion_matrix=None,
            test_samples=0,
            test_skipped=skipped,
        ),
        MlflowResource(),
        "/root/x",
        "abc",
    )
    assert meta["test"] == skipped and meta["test_samples"] == 0
    assert not {"accuracy", "macro_f1", "confusion_matrix", "confusion_matrix_chart"} & set(meta)
