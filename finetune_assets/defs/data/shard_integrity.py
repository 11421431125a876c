"""``mds_shards``' integrity: splits readable, counts as in ``tokenized_reviews``, none empty."""

import dagster as dg

from finetune_assets.core.evaluation.charts import markdown_table
from finetune_assets.core.io.contracts import MDS_SHARDS as SHARDS
from finetune_assets.core.io.contracts import SPLITS, read_token_stats
from finetune_assets.core.io.contracts import TOKENIZED_REVIEWS as TOKENIZED
from finetune_assets.core.shards.mds import read_back_count
from finetune_assets.defs.common import version_check_spec, version_of
from finetune_assets.defs.resources.storage_root import StorageResource

SHARD_SPECS = [
    version_check_spec(
        "splits_readable",
        SHARDS,
        "every split opens and decodes with streaming.StreamingDataset",
        True,
        reads=[TOKENIZED],
    ),
    version_check_spec(
        "counts_match_tokenized",
        SHARDS,
        "samples per split equal tokenized_reviews rows per split",
        True,
        reads=[TOKENIZED],
    ),
    version_check_spec(
        "no_empty_split",
        SHARDS,
        "train, validation and test each hold at least one sample",
        True,
        reads=[TOKENIZED],
    ),
]


@dg.multi_asset_check(specs=SHARD_SPECS, name="mds_shards_integrity", can_subset=True)
def mds_shards_integrity(context: dg.AssetCheckExecutionContext, storage: StorageResource):
    """Shards as the trainer will read them, compared with the tokenized rows they came from."""
    version = version_of(context)
    store = storage.storage()
    shards = store.require(SHARDS, version)
    tokens = store.require(TOKENIZED, version)
    published = read_token_stats(
        tokens.url, store.fs
    ).splits  # rows per split, as tokenized_reviews counted them
    expected = {s: published.get(s, 0) for s in SPLITS}
    seen: dict[str, int | None] = {}
    errors: dict[str, str] = {}
    with store.local_copy(shards.url) as local:
        for split in SPLITS:
            try:
                seen[split] = read_back_count(local / split)
            # any reader failure is the finding, reported per split
            except Exception as err:
                seen[split], errors[split] = None, f"{type(err).__name__}: {err}"
    table = dg.MetadataValue.md(
        markdown_table(
            ("split", "tokenized rows", "MDS samples"),
            [(s, expected[s], seen[s] if seen[s] is not None else "unreadable") for s in SPLITS],
        )
    )
    selected = {k.name for k in context.selected_asset_check_keys}
    path = dg.MetadataValue.path(shards.url)

    def result(name, passed, description, **metadata):
        return dg.AssetCheckResult(
            check_name=name,
            asset_key=SHARDS,
            passed=bool(passed),
            severity=dg.AssetCheckSeverity.ERROR,
            description=description,
            metadata={"splits": table, "path": path, **metadata},
        )

    if "splits_readable" in selected:
        yield result(
            "splits_readable",
            not errors,
            "; ".join(f"{s}: {e}" for s, e in errors.items()) or "all splits readable",
            errors=dg.MetadataValue.json(errors),
            fix="re-materialize mds_shards for this version" if errors else "",
        )
    if "counts_match_tokenized" in selected:
        diff = {
            s: {"tokenized": expected[s], "mds": seen[s]} for s in SPLITS if seen[s] != expected[s]
        }
        yield result(
            "counts_match_tokenized",
            not diff,
            f"mismatched splits: {diff}" if diff else "every split matches tokenized_reviews",
            mismatches=dg.MetadataValue.json(diff),
            fix="re-materialize mds_shards (it may predate the current tokenized_reviews)"
            if diff
            else "",
        )
    if "no_empty_split" in selected:
        empty = [s for s in SPLITS if not seen[s]]
        yield result(
            "no_empty_split",
            not empty,
            f"empty splits: {empty}" if empty else "no empty split",
            empty_splits=dg.MetadataValue.json(empty),
            fix="add data, or change raw_reviews validation/test fractions" if empty else "",
        )
