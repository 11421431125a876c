"""Real public review sets with their own label sets through the whole graph: a binary set (UCI Amazon
sentences, ``0``/``1``) and a 1-5 star set (women's clothing reviews), with ``dagster.materialize`` and
with the CLI as a user types it. Fixtures and licenses: ``fixtures/SOURCE.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from finetune_assets.data.labels import STARS_LABEL_SET, LabelSet, label_set_of_source
from finetune_assets.data.sources import SourceSpec
from finetune_assets.definitions import build_defs
from finetune_assets.storage import Storage
from finetune_assets.versions import register_version
from finetune_assets_tests.test_user_path import QUICK_TRAINING, sh, user_env  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
FIXTURES = Path(__file__).parent / "fixtures"
BINARY = FIXTURES / "amazon_cells_binary.tsv"
STARS = FIXTURES / "clothing_reviews_stars.csv"
BINARY_LABELS = LabelSet(("Negative", "Positive"), {"0": "Negative", "1": "Positive"})
CONTRACT = {"min_rows_per_class": 20}  # small real slices: 25..158 reviews per class


def _run_config(tiny_model_dir: Path) -> dict:
    return {"ops": {"pretrained_model": {"config": {"source": str(tiny_model_dir)}},
                    "tokenized_reviews": {"config": {"max_length": 64}},
                    "raw_reviews_contract": {"config": CONTRACT},
                    "finetuned_model": {"config": {**QUICK_TRAINING, "accelerator": "cpu"}}}}


def _metadata(result, asset: str) -> dict:
    [event] = [m for m in result.get_asset_materialization_events() if m.asset_key.to_user_string() == asset]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_binary_and_star_sets_through_dagster_materialize(instance, storage_root, tiny_model_dir):
    from mlflow import MlflowClient

    from finetune_assets.cli import Classifier
    from finetune_assets.resources.mlflow import MlflowResource

    defs = build_defs(str(storage_root))
    assets = [a for a in defs.assets if isinstance(a, dg.AssetsDefinition)]
    checks_defs = list(defs.asset_checks or [])
    store = Storage(str(storage_root))
    cases = {"amazon": (BINARY, BINARY_LABELS, "review-classifier-negative-positive"),
             "clothing": (STARS, STARS_LABEL_SET, "review-classifier-1_star-2_stars-3_stars-4_stars-5_stars")}
    register_version(instance, store, "amazon", SourceSpec(uri=str(BINARY)),
                     labels=label_set_of_source(SourceSpec(uri=str(BINARY)), BINARY_LABELS.names,
                                                BINARY_LABELS.mapping))
    register_version(instance, store, "clothing", SourceSpec(uri=str(STARS)),
                     labels=label_set_of_source(SourceSpec(uri=str(STARS))))  # inferred: five star classes
    client = MlflowClient(MlflowResource().resolve_tracking_uri(store))
    ops = _run_config(tiny_model_dir)["ops"]
    assert dg.materialize(assets, instance=instance, resources=dict(defs.resources), selection=["pretrained_model"],
                          run_config={"ops": {"pretrained_model": ops["pretrained_model"]}}).success
    partitioned = [a.key for a in assets if a.partitions_def is not None]
    for version, (_, labels, model_name) in cases.items():
        result = dg.materialize([*assets, *checks_defs], instance=instance, partition_key=version, resources=dict(defs.resources),
                                selection=partitioned, raise_on_error=False,
                                run_config={"ops": {k: v for k, v in ops.items() if k != "pretrained_model"}})
        assert result.success, version
        names = list(labels.names)
        raw = _metadata(result, "raw_reviews")
        assert list(raw["label_counts"]) == names and all(raw["label_counts"].values())
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
        assert checks["min_rows_per_class"].passed
        assert list(checks["min_rows_per_class"].metadata["rows_per_class"].value) == names
        model = _metadata(result, "finetuned_model")
        assert all(f"| {n} |" in model["f1_per_class"] for n in names)
        assert {k[len("f1_"):] for k in model if k.startswith("f1_") and k != "f1_per_class"} == set(names)
        matrix = model["confusion_matrix"]["rows_true_cols_pred"]
        assert len(matrix) == len(names) and all(len(r) == len(names) for r in matrix)
        assert all(f"**{n}**" in model["confusion_matrix_chart"] for n in names)
        assert model["registered_model"].startswith(f"{model_name} v")
        # the gate compared within the label set's own registered model: first model -> champion there
        assert checks["quality_gate"].passed, checks["quality_gate"].description
        assert str(client.get_model_version_by_alias(model_name, "champion").version) == "1"
        published = store.require("finetuned_model", version)
        config = json.loads((Path(published.url) / "model" / "config.json").read_text())
        assert config["id2label"] == {str(i): n for i, n in enumerate(names)}
        [(label, _, scores)] = Classifier.from_folder(Path(published.url)).predict(["Love it, fits great"], 64)
        assert label in names and list(scores) == names
    assert not client.search_registered_models("name = 'review-classifier'")  # the seed's model untouched


def test_binary_set_through_the_cli_and_stars_registered(user_env, tiny_model_dir):  # noqa: F811 - fixture
    """The user's path with the CLI: the binary set whole (refused, registered with its labels, materialized,
    predicted); the star set registered with the one-flag 3-class mapping and title + body (its graph run
    is the dagster.materialize test above: one CLI graph run costs minutes)."""
    import subprocess

    from finetune_assets_tests.test_user_path import BIN, REPO

    refused = subprocess.run([str(BIN / "finetune-assets"), "versions", "add", "amazon", "--source", str(BINARY)],
                             cwd=REPO, env=user_env, capture_output=True, text=True)
    assert refused.returncode == 2 and "--label-mapping 0=Negative,1=Positive" in refused.stderr
    out = sh(user_env, "finetune-assets", "versions", "add", "amazon", "--source", str(BINARY),
             "--labels", "Negative,Positive", "--label-mapping", "0=Negative,1=Positive")
    assert "labels: Negative, Positive" in out
    out = sh(user_env, "finetune-assets", "versions", "add", "clothing", "--source", str(STARS),
             "--text-column", "Title,Review Text", "--label-mapping", "stars-to-sentiment")
    assert "labels: Negative, Neutral, Positive" in out
    sh(user_env, "dagster", "asset", "materialize", "-m", "finetune_assets.definitions", "--select", "*",
       "--partition", "amazon", "--config-json", json.dumps(_run_config(tiny_model_dir)))
    row = json.loads(sh(user_env, "finetune-assets", "predict", "--version", "amazon", "--json", "Waste of money"))
    assert row["label"] in ("Negative", "Positive") and list(row["scores"]) == ["Negative", "Positive"]
