"""The four data assets through Dagster, on real reviews: materialize per version, metadata,
clear failures.
"""

from __future__ import annotations

import csv
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from finetune_assets.core.io.contracts import ACCEPTED_SCHEMA
from finetune_assets.core.io.storage import ATTEMPTS, Storage, join
from finetune_assets.core.sources import SourceSpec
from finetune_assets.definitions import build_defs
from finetune_assets.defs.versions.register import register_version

DATA_ASSETS = ("raw_reviews", "tokenized_reviews", "mds_shards")
ALL_DATA_ASSETS = ("pretrained_model", *DATA_ASSETS)


def _rows(path: Path) -> int:
    with path.open(newline="", encoding="utf-8") as f:
        return sum(1 for r in csv.reader(f) if r) - 1


def materialize(
    storage_root: Path,
    instance,
    selection,
    partition: str | None = None,
    *,
    tiny_model_dir: Path | None = None,
    raw_config: dict | None = None,
    raise_on_error: bool = True,
    extra_ops: dict | None = None,
) -> dg.ExecuteInProcessResult:
    """Materialize ``selection`` from the real code location (``build_defs``) over
    ``storage_root``.
    """
    defs = build_defs(str(storage_root))
    assets = [a for a in defs.assets if isinstance(a, dg.AssetsDefinition)]
    ops: dict = {}
    if tiny_model_dir is not None and "pretrained_model" in selection:
        ops["pretrained_model"] = {"config": {"source": str(tiny_model_dir)}}
    if raw_config and "raw_reviews" in selection:
        ops["raw_reviews"] = {"config": raw_config}
    if "tokenized_reviews" in selection:
        ops["tokenized_reviews"] = {"config": {"max_length": 128}}
    ops.update({k: v for k, v in (extra_ops or {}).items() if k in selection})
    return dg.materialize(
        assets,
        selection=list(selection),
        instance=instance,
        partition_key=partition,
        resources=dict(defs.resources),
        run_config={"ops": ops},
        raise_on_error=raise_on_error,
    )


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    [event] = [
        m
        for m in result.get_asset_materialization_events()
        if m.asset_key.to_user_string() == asset
    ]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def _failure_message(result: dg.ExecuteInProcessResult) -> str:
    failures = [e for e in result.all_events if e.is_step_failure]
    assert failures, "expected a failed step"
    err = failures[0].step_failure_data.error
    messages = []
    while err is not None:
        messages.append(err.message)
        err = err.cause
    return "\n".join(messages)


@pytest.fixture
def base_model(storage_root: Path, instance, tiny_model_dir: Path) -> Path:
    materialize(storage_root, instance, ["pretrained_model"], tiny_model_dir=tiny_model_dir)
    return storage_root


@pytest.mark.slow
def test_four_data_assets_materialize_for_a_dataset_version(
    storage_root, instance, tiny_model_dir, arabic_reviews: Path
):
    store = Storage(str(storage_root))
    register_version(instance, store, "v1", SourceSpec(uri=str(arabic_reviews / "PROD.csv")))
    assert instance.get_dynamic_partitions("dataset_versions") == ["v1"]
    result = materialize(
        storage_root, instance, ["pretrained_model"], tiny_model_dir=tiny_model_dir
    )
    model_md = _metadata(result, "pretrained_model")
    assert (
        model_md["vocab_size"] == 30522
        and model_md["architecture"] == "BertForSequenceClassification"
    )
    result = materialize(storage_root, instance, DATA_ASSETS, "v1")
    assert result.success

    n_file = _rows(arabic_reviews / "PROD.csv")
    raw_md = _metadata(result, "raw_reviews")
    assert raw_md["rows_in"] == n_file
    assert raw_md["dagster/row_count"] + raw_md["rejected_rows"] == n_file
    assert sum(raw_md["label_counts"].values()) == raw_md["dagster/row_count"]
    assert set(raw_md["label_counts"]) == {"Positive", "Negative", "Mixed"}
    # The table and the chart under keys of their own (one used to overwrite the other); the
    # accepted rows' columns as Dagster's column schema (the UI's "Columns").
    assert "| label |" in raw_md["label_distribution"]
    assert "label distribution" in raw_md["label_distribution_chart"]
    columns = [c.name for c in raw_md["dagster/column_schema"].columns]
    assert columns == ACCEPTED_SCHEMA.names

    tok_md = _metadata(result, "tokenized_reviews")
    assert tok_md["dagster/row_count"] == raw_md["dagster/row_count"]
    assert sum(tok_md["split_counts"].values()) == tok_md["dagster/row_count"]
    assert tok_md["token_dtype"] == "uint16" and tok_md["max_length"] == 128
    assert 0 < tok_md["tokens_p50"] <= tok_md["tokens_p95"] <= tok_md["tokens_max"]
    # a cold cache: every row tokenized anew, then indexed for the next version
    assert (tok_md["reused_rows"], tok_md["new_rows"]) == (0, tok_md["dagster/row_count"])
    assert tok_md["token_cache_index_rows"] == tok_md["dagster/row_count"]

    shards_md = _metadata(result, "mds_shards")
    assert shards_md["samples_per_split"] == tok_md["split_counts"]
    assert shards_md["bytes"] > 0

    # every asset published under its own version folder; data versions are content hashes
    for asset in DATA_ASSETS:
        published = store.require(asset, "v1")
        assert published.url.startswith(join(str(storage_root), asset, "v1", ATTEMPTS))
        assert len(published.data_version) == 16
    accepted = pq.read_table(Path(store.require("raw_reviews", "v1").url) / "reviews.parquet")
    rejected = pq.read_table(Path(store.require("raw_reviews", "v1").url) / "rejected.parquet")
    assert accepted.num_rows + rejected.num_rows == n_file
    record = instance.get_latest_materialization_event(dg.AssetKey("mds_shards"))
    assert record.asset_materialization.partition == "v1"

    # the same inputs give the same data versions (content hashes, not run ids)
    before = {a: store.require(a, "v1").data_version for a in ("raw_reviews", "tokenized_reviews")}
    again = _metadata(
        materialize(storage_root, instance, ["raw_reviews", "tokenized_reviews"], "v1"),
        "tokenized_reviews",
    )
    assert {a: store.require(a, "v1").data_version for a in before} == before
    # ... and every row now comes from the cache, through its index (nothing new to merge into it)
    assert (again["reused_rows"], again["new_rows"]) == (tok_md["dagster/row_count"], 0)
    assert again["token_cache_index_rows"] == tok_md["dagster/row_count"]


def test_bad_version_key_is_rejected_with_a_clear_error(
    storage_root, instance, arabic_reviews: Path
):
    from finetune_assets.defs.versions.partitions import InvalidVersionKey

    store = Storage(str(storage_root))
    for key in ("../escape", "v 1", "a/b"):
        with pytest.raises(InvalidVersionKey, match="invalid dataset version key"):
            register_version(instance, store, key, SourceSpec(uri=str(arabic_reviews / "PROD.csv")))
    assert instance.get_dynamic_partitions("dataset_versions") == []
    assert not (storage_root / "versions").exists() or not any(
        (storage_root / "versions").iterdir()
    )


def test_unregistered_version_fails_with_how_to_register(base_model: Path, instance):
    instance.add_dynamic_partitions("dataset_versions", ["ghost"])
    result = materialize(base_model, instance, ["raw_reviews"], "ghost", raise_on_error=False)
    assert not result.success
    message = _failure_message(result)
    assert "no registered source" in message and "finetune-assets versions add ghost" in message
    assert not (base_model / "raw_reviews").exists()


@pytest.mark.parametrize(
    "case", ["missing_file", "unreadable_format", "no_text_column", "undecodable"]
)
def test_bad_source_fails_naming_the_file_and_nothing_is_published(
    case, base_model: Path, instance, arabic_reviews: Path, tmp_path: Path
):
    """The Dagster failure names file and problem; no CURRENT pointer and no attempt folder
    remain.
    """
    if case == "missing_file":
        path, expect = tmp_path / "nowhere.csv", "no such file"
    elif case == "unreadable_format":
        path, expect = tmp_path / "reviews.parquet", "cannot read as parquet"
        path.write_bytes((arabic_reviews / "PROD.csv").read_bytes())  # a CSV under a .parquet name
    elif case == "no_text_column":
        path, expect = tmp_path / "reviews.csv", "no text column"
        path.write_text(
            (arabic_reviews / "PROD.csv")
            .read_text(encoding="utf-8")
            .replace("text,", "opinion,", 1),
            encoding="utf-8",
        )
    else:
        path, expect = tmp_path / "cp1256.csv", "encoding='cp1256'"
        path.write_bytes(
            (arabic_reviews / "PROD.csv").read_text(encoding="utf-8").encode("cp1256", "replace")
        )
    store = Storage(str(base_model))
    register_version(instance, store, "bad", SourceSpec(uri=str(path)))
    result = materialize(base_model, instance, DATA_ASSETS, "bad", raise_on_error=False)
    assert not result.success
    message = _failure_message(result)
    assert str(path) in message and expect in message
    for asset in DATA_ASSETS:
        assert store.current(asset, "bad") is None
        assert not (base_model / asset / "bad" / ATTEMPTS).exists() or not any(
            (base_model / asset / "bad" / ATTEMPTS).iterdir()
        )


def test_failed_rematerialization_keeps_the_previous_version(
    base_model: Path, instance, arabic_reviews: Path, tmp_path: Path
):
    store = Storage(str(base_model))
    src = tmp_path / "drop.csv"
    src.write_bytes((arabic_reviews / "RES2.csv").read_bytes())
    register_version(instance, store, "v1", SourceSpec(uri=str(src)))
    materialize(base_model, instance, DATA_ASSETS, "v1")
    good = {a: store.require(a, "v1") for a in DATA_ASSETS}
    src.write_text("", encoding="utf-8")  # the source breaks
    result = materialize(base_model, instance, DATA_ASSETS, "v1", raise_on_error=False)
    assert not result.success and "file is empty" in _failure_message(result)
    assert {a: store.require(a, "v1") for a in DATA_ASSETS} == good
    for asset in DATA_ASSETS:  # only the published attempt remains
        assert [p.name for p in (base_model / asset / "v1" / ATTEMPTS).iterdir()] == [
            good[asset].attempt
        ]


def test_raw_reviews_config_overrides_the_registered_source(
    base_model: Path, instance, arabic_reviews: Path, tmp_path: Path
):
    store = Storage(str(base_model))
    path = tmp_path / "cp1256.csv"
    path.write_bytes(
        (arabic_reviews / "PROD.csv").read_text(encoding="utf-8").encode("cp1256", "replace")
    )
    register_version(instance, store, "v1", SourceSpec(uri=str(path)))
    result = materialize(
        base_model, instance, ["raw_reviews"], "v1", raw_config={"encoding": "cp1256"}
    )
    md = _metadata(result, "raw_reviews")
    assert md["rows_in"] == _rows(arabic_reviews / "PROD.csv")
    assert md["dagster/row_count"] + md["rejected_rows"] == md["rows_in"]


def test_downstream_asset_without_upstream_names_what_to_materialize(base_model: Path, instance):
    instance.add_dynamic_partitions("dataset_versions", ["v1"])
    result = materialize(base_model, instance, ["tokenized_reviews"], "v1", raise_on_error=False)
    assert not result.success
    assert "raw_reviews[v1] has not been materialized" in _failure_message(result)
    assert not (base_model / "tokenized_reviews").exists() or not any(
        (base_model / "tokenized_reviews" / "v1" / ATTEMPTS).iterdir()
    )
