"""What Dagster marks stale after changing only the base model, or only a hyper-parameter
default.
"""

import json
import re
import shutil
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from finetune_assets.core.io.contracts import TRAINING_RESULT_FILE, TrainingResult
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.launchers.base import TrainingSpec
from finetune_assets.core.sources import SourceSpec
from finetune_assets.definitions import build_defs
from finetune_assets.defs.data.mds_shards import ShardsConfig, mds_shards
from finetune_assets.defs.data.pretrained import PretrainedModelConfig, pretrained_model
from finetune_assets.defs.data.raw import RawReviewsConfig, raw_reviews
from finetune_assets.defs.data.tokenized import TokenizeConfig, tokenized_reviews
from finetune_assets.defs.models.baseline_model import BaselineConfig
from finetune_assets.defs.models.finetuned import FinetuneConfig, finetuned_model
from finetune_assets.defs.promotion import PromotionConfig
from finetune_assets.defs.resources.launchers import TrainingLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.staleness import config_class, with_config_versions
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets.defs.versions.register import write_version

CHAIN = ["raw_reviews", "tokenized_reviews", "mds_shards", "finetuned_model"]


def _chain_assets():
    """The five assets the way the code location builds them: config defaults folded into code
    versions.
    """
    return with_config_versions(
        [raw_reviews, pretrained_model, tokenized_reviews, mds_shards, finetuned_model]
    )


class CopyLauncher(TrainingLauncher):
    """Stands in for torchrun: 'trains' by copying the base model and writing the metrics file."""

    def launch(self, context, job: TrainingSpec) -> None:
        cfg = json.loads(Path(job.config_url).read_text())
        out = Path(cfg["output_dir"])
        shutil.copytree(cfg["model_dir"], out / "model")
        (out / TRAINING_RESULT_FILE).write_text(
            TrainingResult(
                accuracy=0.5,
                macro_f1=0.4,
                f1_per_class={"Positive": 0.6, "Negative": 0.4, "Mixed": 0.2},
                confusion_matrix=[[1, 0, 0], [0, 1, 0], [0, 0, 1]],
                test_samples=3,
                samples_seen=3,
                tokens_seen=30,
                train_seconds=1.0,
                samples_per_sec=1.0,
                tokens_per_sec=1.0,
                global_step=1,
                epochs=1,
                world_size=1,
                labels=cfg["labels"],
                wall_seconds=1.0,
            ).to_json()
        )


def _materialize(assets, instance, root, selection, partition=None, run_config=None):
    result = dg.materialize(
        assets,
        selection=selection,
        partition_key=partition,
        instance=instance,
        run_config=run_config,
        resources={
            "storage": StorageResource(root=str(root)),
            "mlflow": MlflowResource(),
            "launcher": CopyLauncher(),
        },
    )
    assert result.success


def _status(assets, instance) -> dict[str, StaleStatus]:
    graph = AssetGraph.from_assets(assets)
    resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    out = {"pretrained_model": resolver.get_status(dg.AssetKey("pretrained_model"))}
    for key in CHAIN:
        out[key] = resolver.get_status(dg.AssetKey(key), "v1")
    return out


def _base(source: Path, seed: int) -> dg.RunConfig:
    return dg.RunConfig(ops={"pretrained_model": {"config": {"source": str(source), "seed": seed}}})


@pytest.fixture
def built(instance, storage_root, tiny_model_dir, arabic_reviews):
    assets = _chain_assets()
    write_version(
        Storage(str(storage_root)), "v1", SourceSpec(uri=str(arabic_reviews / "PROD.csv"))
    )
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    _materialize(
        assets,
        instance,
        storage_root,
        dg.AssetSelection.assets("pretrained_model"),
        run_config=_base(tiny_model_dir, 0),
    )
    _materialize(assets, instance, storage_root, dg.AssetSelection.assets(*CHAIN), partition="v1")
    assert set(_status(assets, instance).values()) == {StaleStatus.FRESH}
    return assets


def test_new_base_model_marks_the_version_chain_stale_but_not_the_data(
    built, instance, storage_root, tmp_path
):
    from finetune_assets_tests.tiny_models import build_tiny_bert

    # Another base model (other weights, same tokenizer) -> a new pretrained_model data version.
    other = build_tiny_bert(tmp_path / "other-base", seed=1)
    _materialize(
        built,
        instance,
        storage_root,
        dg.AssetSelection.assets("pretrained_model"),
        run_config=_base(other, 0),
    )
    # Dagster judges each asset by its direct inputs: the two readers of pretrained_model are stale,
    # mds_shards (reads only tokens) and raw_reviews are not.
    assert _status(built, instance) == {
        "pretrained_model": StaleStatus.FRESH,
        "raw_reviews": StaleStatus.FRESH,
        "tokenized_reviews": StaleStatus.STALE,
        "mds_shards": StaleStatus.FRESH,
        "finetuned_model": StaleStatus.STALE,
    }
    # Re-tokenizing gives identical tokens (same tokenizer) and the same data version, so mds_shards
    # stays fresh without being rebuilt (a new vocabulary would give new tokens and make it stale);
    # only the model still needs the new base.
    _materialize(
        built, instance, storage_root, dg.AssetSelection.assets("tokenized_reviews"), partition="v1"
    )
    status = _status(built, instance)
    assert (
        status["mds_shards"] == StaleStatus.FRESH and status["finetuned_model"] == StaleStatus.STALE
    )
    _materialize(
        built, instance, storage_root, dg.AssetSelection.assets("finetuned_model"), partition="v1"
    )
    assert set(_status(built, instance).values()) == {StaleStatus.FRESH}


def test_rebuilding_an_identical_base_model_marks_nothing_stale(
    built, instance, storage_root, tiny_model_dir
):
    _materialize(
        built,
        instance,
        storage_root,
        dg.AssetSelection.assets("pretrained_model"),
        run_config=_base(tiny_model_dir, 0),
    )
    assert set(_status(built, instance).values()) == {StaleStatus.FRESH}


ALL = {"pretrained_model", *CHAIN}
FRESH_ALL = dict.fromkeys(ALL, StaleStatus.FRESH)


def _change_default(monkeypatch, config_cls, field: str, value) -> None:
    """Edit one default as a person would in the source (the class is rebuilt by nobody: its
    field info changes).
    """
    monkeypatch.setattr(config_cls.model_fields[field], "default", value)


# (config class, field, new default, assets Dagster then marks stale). Only the asset whose default
# changed: its descendants follow once it is rebuilt *and* its content (the data version is a
# content hash) changes, as the base-model test above shows; a rebuild that writes the same bytes
# leaves them fresh.
DEFAULT_CHANGES = [
    (RawReviewsConfig, "max_text_chars", 10_000, {"raw_reviews"}),
    (PretrainedModelConfig, "seed", 1, {"pretrained_model"}),
    (TokenizeConfig, "max_length", 256, {"tokenized_reviews"}),
    (TokenizeConfig, "batch_size", 64, set()),  # same tokens whatever the batch: unversioned
    (ShardsConfig, "size_limit", "32mb", {"mds_shards"}),
    (FinetuneConfig, "lr", 1e-4, {"finetuned_model"}),
    (FinetuneConfig, "bucket_batches", 1, {"finetuned_model"}),
    (FinetuneConfig, "num_workers", 2, set()),  # cannot change the model: unversioned
]


def test_changing_one_default_at_a_time_marks_exactly_the_expected_assets_stale(
    built, instance, monkeypatch
):
    for config_cls, field, value, expected in DEFAULT_CHANGES:
        with monkeypatch.context() as m:
            _change_default(m, config_cls, field, value)
            # rebuilt like the code location rebuilds on reload
            status = _status(_chain_assets(), instance)
        stale = {k for k, v in status.items() if v == StaleStatus.STALE}
        assert stale == expected, (
            f"{config_cls.__name__}.{field}: stale {sorted(stale)}, expected {sorted(expected)}"
        )
        assert {k for k, v in status.items() if v != StaleStatus.STALE} == ALL - expected
    assert _status(_chain_assets(), instance) == FRESH_ALL  # every change undone: fresh again


def _code_versions(tmp_path) -> dict[str, str]:
    graph = build_defs(str(tmp_path)).resolve_asset_graph()
    return {k.to_user_string(): graph.get(k).code_version for k in graph.get_all_asset_keys()}


def test_every_configurable_asset_versions_each_default_except_the_unversioned(
    tmp_path, monkeypatch
):
    """Over the whole code location, every field of every asset's config, one at a time: a versioned
    default changes exactly its own asset's code version; an ``unversioned`` one (cannot change the
    output) changes none.
    """
    before = _code_versions(tmp_path)
    defs = build_defs(str(tmp_path))
    configs = {
        a.key.to_user_string(): config_class(a) for a in defs.assets if config_class(a) is not None
    }
    assert set(configs) == {
        "raw_reviews",
        "pretrained_model",
        "tokenized_reviews",
        "mds_shards",
        "finetuned_model",
        "champion_model",
        "baseline_model",
        "tuning_study",
    }
    assert (
        configs["champion_model"] is PromotionConfig and configs["baseline_model"] is BaselineConfig
    )
    for key, config_cls in configs.items():
        # the code revision, then the hash of the defaults
        assert re.match(r"\d+-[0-9a-f]+$", before[key])
        for field in config_cls.model_fields:
            with monkeypatch.context() as m:
                _change_default(m, config_cls, field, "another default")
                changed = {k for k, v in _code_versions(tmp_path).items() if v != before[k]}
            expected = set() if field in getattr(config_cls, "unversioned", ()) else {key}
            assert changed == expected, (
                f"{config_cls.__name__}.{field}: {sorted(changed)} != {sorted(expected)}"
            )
    assert before["benchmark_scores"] == "1"  # no config: the code revision alone


def test_a_code_revision_bump_changes_the_code_version(tmp_path):
    bumped = tokenized_reviews.map_asset_specs(
        lambda spec: spec.replace_attributes(code_version="2")
    )
    (old,), (new,) = (with_config_versions([a]) for a in (tokenized_reviews, bumped))
    key = dg.AssetKey("tokenized_reviews")
    assert new.code_versions_by_key[key].startswith("2-") and old.code_versions_by_key[
        key
    ].startswith("1-")
    # same defaults, same hash
    assert new.code_versions_by_key[key][2:] == old.code_versions_by_key[key][2:]


# -- data versions hash content, not the writing library -------------------------------------


def test_a_writer_library_upgrade_does_not_change_data_versions(tmp_path):
    """Same reviews and weights written by a newer pyarrow / transformers: same data versions;
    changed data: a new one. Parquet's footer names its writer (``created_by``), save_pretrained
    stamps its version.
    """
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from finetune_assets.core.io.storage import hash_tree

    table = pa.table({"text": ["good", "bad"], "label": ["Positive", "Negative"]})
    old, new, changed = (tmp_path / n / "reviews.parquet" for n in ("old", "new", "changed"))
    for f in (old, new, changed):
        f.parent.mkdir()
    pq.write_table(table, old, compression="zstd")
    body = old.read_bytes()
    writer = f"parquet-cpp-arrow version {pa.__version__}".encode()
    assert writer in body
    upgraded = f"parquet-cpp-arrow version {'9' * len(pa.__version__)}".encode()[: len(writer)]
    new.write_bytes(body.replace(writer, upgraded))
    assert new.read_bytes() != body and pq.read_table(new).equals(table)
    assert hash_tree(new) == hash_tree(old)
    pq.write_table(table, new, compression="snappy")  # another writer default: same table
    assert hash_tree(new) == hash_tree(old)
    pq.write_table(table.set_column(1, "label", pa.array(["Positive", "Mixed"])), changed)
    assert hash_tree(changed) != hash_tree(old)

    a, b = tmp_path / "a", tmp_path / "b"
    for folder, version in ((a, "4.40.0"), (b, "4.57.1")):
        folder.mkdir()
        (folder / "config.json").write_text(
            json.dumps({"hidden_size": 32, "transformers_version": version})
        )
        (folder / "model.safetensors").write_bytes(b"weights")
        with pa.ipc.new_file(
            str(folder / "tokens.arrow"),
            table.schema,
            options=pa.ipc.IpcWriteOptions(compression="zstd" if folder == a else None),
        ) as w:
            w.write_table(table)
    assert hash_tree(a) == hash_tree(b)
    (b / "config.json").write_text(
        json.dumps({"hidden_size": 64, "transformers_version": "4.57.1"})
    )
    assert hash_tree(a) != hash_tree(b)
