"""``finetuned_model`` materialized through Dagster with the local torchrun launcher on fixture shards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import pytest

from finetune_assets.assets.finetuned import finetuned_model
from finetune_assets.launchers.local import LocalTorchrunLauncher
from finetune_assets.partitions import DATASET_VERSIONS
from finetune_assets.resources.mlflow import MlflowResource
from finetune_assets.resources.storage import StorageResource
from finetune_assets.storage import Storage, hash_tree
from finetune_assets_tests.training.fixtures import write_mds_splits

REPO = Path(__file__).resolve().parents[2]


def _publish_upstream(store: Storage, version: str, tiny_model_dir: Path, reviews_csv: Path) -> None:
    with store.publish("pretrained_model") as staging:
        shutil.copytree(tiny_model_dir, staging.local_dir, dirs_exist_ok=True)
        staging.data_version = hash_tree(staging.local_dir)
    with store.publish("mds_shards", version) as staging:
        write_mds_splits(staging.local_dir, tiny_model_dir, reviews_csv)
        staging.data_version = hash_tree(staging.local_dir)


@pytest.mark.slow
def test_materialize_finetuned_model(storage_root, instance, tiny_model_dir, arabic_reviews):
    store = Storage(str(storage_root))
    _publish_upstream(store, "v1", tiny_model_dir, arabic_reviews / "PROD.csv")
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    run_config = dg.RunConfig(ops={"finetuned_model": {"config": {
        "epochs": 1, "accelerator": "cpu", "num_workers": 0, "checkpoint_every_n_steps": 5, "log_every_n_steps": 2,
    }}})
    result = dg.materialize(
        [finetuned_model],
        partition_key="v1",
        instance=instance,
        run_config=run_config,
        resources={
            "storage": StorageResource(root=str(storage_root)),
            "launcher": LocalTorchrunLauncher(nproc_per_node=1, cwd=str(REPO)),
            "mlflow": MlflowResource(ui_base_url="http://mlflow.example:5000"),
        },
    )
    assert result.success
    mat = result.asset_materializations_for_node("finetuned_model")[0]
    meta = mat.metadata
    assert 0.0 <= meta["accuracy"].value <= 1.0 and "macro_f1" in meta and "f1_Mixed" in meta
    assert meta["samples_seen"].value == 96
    assert meta["registered_model"].value == "review-classifier v1"
    assert meta["mlflow_run"].value.startswith("http://mlflow.example:5000/#/experiments/")

    published = store.require("finetuned_model", "v1")
    assert mat.tags["dagster/data_version"] == published.data_version
    assert meta["model_path"].value == f"{published.url}/model"
    model_dir = Path(published.url) / "model"
    assert published.data_version == hash_tree(model_dir)
    trainer_cfg = json.loads((Path(published.url) / "trainer_config.json").read_text())
    assert trainer_cfg["mlflow"]["tracking_uri"] == f"sqlite:///{storage_root}/mlflow/mlflow.db"
    assert trainer_cfg["mlflow"]["tags"]["dataset_version"] == "v1"
    assert trainer_cfg["checkpoint_dir"].startswith(f"{storage_root}/finetuned_model/v1/checkpoints/")
    assert (storage_root / "mlflow" / "artifacts").is_dir()  # artifacts under the root, not ./mlruns
