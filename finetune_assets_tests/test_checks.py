"""Asset checks on real reviews: the data contract, shard integrity, and the model quality gate."""

import shutil
from pathlib import Path

import dagster as dg
import pytest
import torch

from finetune_assets.assets.finetuned import finetuned_model
from finetune_assets.assets.pretrained import pretrained_model
from finetune_assets.assets.raw import raw_reviews
from finetune_assets.assets.shards import mds_shards
from finetune_assets.assets.tokenized import tokenized_reviews
from finetune_assets.checks import mds_shards_integrity, quality_gate, raw_reviews_contract
from finetune_assets.data.labels import LABEL2ID
from finetune_assets.data.sources import SourceSpec
from finetune_assets.launchers.local import LocalTorchrunLauncher
from finetune_assets.partitions import DATASET_VERSIONS
from finetune_assets.resources.mlflow import MlflowResource
from finetune_assets.resources.storage import StorageResource
from finetune_assets.storage import Storage, hash_tree
from finetune_assets.versions import write_version

ALL = [raw_reviews, pretrained_model, tokenized_reviews, mds_shards, finetuned_model,
       raw_reviews_contract, mds_shards_integrity, quality_gate]
DATA_CHAIN = dg.AssetSelection.assets("raw_reviews", "tokenized_reviews", "mds_shards")


def _resources(storage_root: Path) -> dict:
    return {"storage": StorageResource(root=str(storage_root)), "mlflow": MlflowResource(),
            "launcher": LocalTorchrunLauncher()}


def _build_base(instance, storage_root: Path, model_dir: Path) -> None:
    result = dg.materialize(ALL, selection=dg.AssetSelection.assets("pretrained_model"), instance=instance,
                            resources=_resources(storage_root),
                            run_config=dg.RunConfig(ops={"pretrained_model": {"config": {"source": str(model_dir)}}}))
    assert result.success


def _run(instance, storage_root: Path, version: str, source: Path, selection=DATA_CHAIN, run_config=None):
    if not instance.has_dynamic_partition(DATASET_VERSIONS, version):
        write_version(Storage(str(storage_root)), version, SourceSpec(uri=str(source)))
        instance.add_dynamic_partitions(DATASET_VERSIONS, [version])
    return dg.materialize(ALL, selection=selection, partition_key=version, instance=instance,
                          resources=_resources(storage_root), raise_on_error=False, run_config=run_config)


def _checks(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


@pytest.fixture
def base(instance, storage_root, tiny_model_dir):
    _build_base(instance, storage_root, tiny_model_dir)
    return tiny_model_dir


def test_contract_and_shards_pass_on_real_reviews(instance, storage_root, base, arabic_reviews, tmp_path):
    drop = tmp_path / "v1"
    drop.mkdir()
    shutil.copy(arabic_reviews / "PROD.csv", drop)
    result = _run(instance, storage_root, "v1", drop)
    assert result.success
    checks = _checks(result)
    assert {n: c.passed for n, c in checks.items()} == {
        "schema_and_labels": True, "rejected_share": True, "duplicate_share": True, "min_rows_per_class": True,
        "splits_readable": True, "counts_match_tokenized": True, "no_empty_split": True}
    per_class = checks["min_rows_per_class"].metadata["rows_per_class"].value
    assert per_class == {"Positive": 3096, "Negative": 862, "Mixed": 306}
    assert checks["duplicate_share"].metadata["conflicting_duplicates"].value == 2
    assert "| test |" in checks["counts_match_tokenized"].metadata["splits"].value
    assert all(c.target_materialization_data is not None or True for c in checks.values())


def test_bad_labels_block_tokenization(instance, storage_root, base, arabic_reviews, tmp_path):
    drop = tmp_path / "bad.csv"
    lines = (arabic_reviews / "PROD.csv").read_text(encoding="utf-8").splitlines()
    # Every fourth review gets a label outside the mapping, and no review is Mixed any more.
    out = [lines[0]]
    for i, line in enumerate(lines[1:]):
        text, _, label = line.rpartition(",")
        out.append(f"{text},{'7' if i % 4 == 0 else ('1' if label == '0' else label)}")
    drop.write_text("\n".join(out) + "\n", encoding="utf-8")
    result = _run(instance, storage_root, "bad", drop)
    checks = _checks(result)
    assert not checks["rejected_share"].passed and checks["rejected_share"].severity == dg.AssetCheckSeverity.ERROR
    assert checks["rejected_share"].metadata["rejected_by_reason"].value.get("unknown_label", 0) > 1000
    assert "unknown_label" in checks["rejected_share"].metadata["examples"].value
    assert not checks["min_rows_per_class"].passed
    assert checks["min_rows_per_class"].metadata["rows_per_class"].value["Mixed"] == 0
    assert checks["schema_and_labels"].passed  # what was accepted is still well-formed
    # Blocking ERROR checks: nothing downstream of raw_reviews ran for this version.
    materialized = {m.asset_key.to_user_string() for m in result.get_asset_materialization_events()
                    for m in [m.event_specific_data.materialization]}
    assert materialized == {"raw_reviews"}
    assert Storage(str(storage_root)).current("tokenized_reviews", "bad") is None


def test_duplicates_warn_without_blocking(instance, storage_root, base, arabic_reviews, tmp_path):
    drop = tmp_path / "dups.csv"
    lines = (arabic_reviews / "PROD.csv").read_text(encoding="utf-8").splitlines()
    drop.write_text("\n".join(lines + lines[1:1200]) + "\n", encoding="utf-8")
    result = _run(instance, storage_root, "dups", drop)
    check = _checks(result)["duplicate_share"]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert result.success and Storage(str(storage_root)).current("mds_shards", "dups") is not None


def test_threshold_is_check_config(instance, storage_root, base, arabic_reviews):
    result = _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv",
                  run_config=dg.RunConfig(ops={"raw_reviews_contract": {"config": {"min_rows_per_class": 400}}}))
    check = _checks(result)["min_rows_per_class"]
    assert not check.passed and "Mixed" in check.description
    assert Storage(str(storage_root)).current("tokenized_reviews", "v1") is None  # blocked by config


def test_shard_integrity_catches_corruption_and_drift(instance, storage_root, base, arabic_reviews):
    assert _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv").success
    store = Storage(str(storage_root))
    shards = Path(store.require("mds_shards", "v1").url)
    (shards / "validation" / "index.json").write_text("{not json")
    # tokenized_reviews re-made with another split rule: the shards no longer match it
    result = _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv",
                  selection=dg.AssetSelection.assets("tokenized_reviews").without_checks()
                  | dg.AssetSelection.checks_for_assets(mds_shards),
                  run_config=dg.RunConfig(ops={"tokenized_reviews": {"config": {"test_fraction": 0.2}}}))
    checks = _checks(result)
    assert not checks["splits_readable"].passed and "validation" in checks["splits_readable"].description
    assert not checks["counts_match_tokenized"].passed
    assert "test" in checks["counts_match_tokenized"].metadata["mismatches"].value


# -- quality gate ------------------------------------------------------------------------------------

def _biased_model(src: Path, dst: Path, label: str) -> Path:
    """The tiny BERT with its head forced to predict one class: a known, cheap score for the gate."""
    from transformers import BertForSequenceClassification

    shutil.copytree(src, dst)
    model = BertForSequenceClassification.from_pretrained(dst)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.fill_(-10.0)
        model.classifier.bias[LABEL2ID[label]] = 10.0
    model.save_pretrained(dst, safe_serialization=True)
    return dst


def _register_challenger(storage_root: Path, version: str, model_dir: Path) -> str:
    """What finetuned_model leaves behind: the published model folder and a registered MLflow version."""
    import mlflow

    store = Storage(str(storage_root))
    resource = MlflowResource()
    uri = resource.resolve_tracking_uri(store)
    # Only a client bound to this store: setting the process-wide URI would hide a gate that forgets its own.
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(resource.experiment_name)
    exp_id = exp.experiment_id if exp else client.create_experiment(
        resource.experiment_name, artifact_location=resource.artifact_location(store))
    run = client.create_run(exp_id)
    client.log_artifacts(run.info.run_id, str(model_dir), "model")
    client.set_terminated(run.info.run_id)
    try:
        client.create_registered_model(resource.registered_model_name)
    except mlflow.exceptions.MlflowException:
        pass
    mv = client.create_model_version(resource.registered_model_name, f"runs:/{run.info.run_id}/model",
                                     run_id=run.info.run_id, tags={"dataset_version": version})
    with store.publish("finetuned_model", version) as staging:
        shutil.copytree(model_dir, staging.local_dir / "model")
        staging.data_version = hash_tree(staging.local_dir)
        staging.metadata = {"mlflow": {"registered_model_name": resource.registered_model_name,
                                       "registered_model_version": int(mv.version), "run_id": run.info.run_id}}
    return str(mv.version)


def _gate(instance, storage_root, version):
    """The gate alone, for one version (as re-executing the check from the UI does)."""
    result = dg.materialize(ALL, selection=dg.AssetSelection.checks_for_assets(finetuned_model), instance=instance,
                            resources=_resources(storage_root), raise_on_error=False,
                            tags={"dagster/partition": version})
    return _checks(result)["quality_gate"]


def _champion(storage_root) -> str:
    import mlflow

    uri = MlflowResource().resolve_tracking_uri(Storage(str(storage_root)))
    return str(mlflow.MlflowClient(uri).get_model_version_by_alias("review-classifier", "champion").version)


def test_gate_promotes_only_models_not_worse_than_the_champion(instance, storage_root, base, arabic_reviews,
                                                              tmp_path):
    assert _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv").success
    good = _biased_model(base, tmp_path / "good", "Positive")  # majority class: macro-F1 ~0.28
    bad = _biased_model(base, tmp_path / "bad", "Mixed")  # rare class: macro-F1 ~0.05

    first = _register_challenger(storage_root, "v1", good)
    check = _gate(instance, storage_root, "v1")
    assert check.passed and "first model" in check.metadata["decision"].value
    assert _champion(storage_root) == first

    worse = _register_challenger(storage_root, "v1", bad)
    check = _gate(instance, storage_root, "v1")
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    meta = check.metadata
    assert meta["challenger_macro_f1"].value < meta["champion_macro_f1"].value
    assert meta["champion"].value == f"review-classifier v{first}"
    assert "refused" in meta["decision"].value and _champion(storage_root) == first
    assert worse != first

    # A new version with a bigger test split: the champion is re-scored on *this* test data, and a
    # challenger that is exactly as good (not worse) is promoted.
    drop = tmp_path / "v2"
    drop.mkdir()
    for f in ("PROD.csv", "RES2.csv"):
        shutil.copy(arabic_reviews / f, drop)
    assert _run(instance, storage_root, "v2", drop).success
    third = _register_challenger(storage_root, "v2", _biased_model(base, tmp_path / "good2", "Positive"))
    check = _gate(instance, storage_root, "v2")
    meta = check.metadata
    assert check.passed and meta["champion_dataset_version"].value == "v1"
    assert meta["champion_macro_f1"].value == pytest.approx(meta["challenger_macro_f1"].value)
    assert meta["test_reviews"].value > 500
    assert _champion(storage_root) == third
