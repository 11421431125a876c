"""``mds_shards[v]``: one MosaicML MDS dataset per split, verified by reading it back."""

from typing import ClassVar

import dagster as dg
from pydantic import Field

from finetune_assets.core.io.contracts import MDS_SHARDS, TOKENIZED_REVIEWS
from finetune_assets.core.io.storage import Staging
from finetune_assets.core.shards import slices
from finetune_assets.core.shards.mds import COMPRESSION, SplitShards, read_back_count
from finetune_assets.defs.common import launch_labels, markdown_table, version_asset, version_of
from finetune_assets.defs.data.slice_workers import fan_out, inputs_digest
from finetune_assets.defs.data.tokenized import tokenized_reviews
from finetune_assets.defs.provenance import read_recorded
from finetune_assets.defs.resources.launchers import TrainingLauncher
from finetune_assets.defs.resources.storage_root import StorageResource


class ShardsConfig(dg.Config):
    # the same samples whatever the worker count (defs/staleness.py)
    unversioned: ClassVar[tuple[str, ...]] = ("workers",)

    size_limit: str = Field("64mb", description="maximum bytes per shard before compression")
    workers: int | None = Field(
        None,
        description="slice worker processes at a time (local runner); default: the usable cores",
    )


@version_asset("reviews", {"mosaicml"}, deps=[tokenized_reviews], code_version="1")
def mds_shards(
    context: dg.AssetExecutionContext,
    config: ShardsConfig,
    storage: StorageResource,
    launcher: TrainingLauncher,
) -> dg.MaterializeResult:
    """MDS shards (zstd) per split, streamable with StreamingDataset from the storage root."""
    from finetune_assets.core.launchers.fanout import runner_width
    from finetune_assets.defs.resources.launchers import fanout_runner

    version = version_of(context)
    store = storage.storage()
    # As Dagster recorded it (storage repaired if a killed run left it ahead).
    tokenized = read_recorded(context.instance, store, TOKENIZED_REVIEWS, version)
    count = tokenized.metadata.get("parts")
    if count is None:
        raise dg.Failure(
            f"tokenized_reviews[{version}] predates slice workers (no parts); re-materialize it"
        )
    runner = fanout_runner(
        launcher,
        workers=config.workers,
        labels=launch_labels(context, MDS_SHARDS, version),
        instance=context.instance,
    )
    with store.publish(MDS_SHARDS, version) as staging:
        spec_url = f"{staging.url}/_work/spec.json"
        groups = slices.group_parts(
            count, runner_width(runner) or count, tokenized.metadata.get("rows")
        )
        slices.write_spec(
            spec_url,
            slices.ShardsSpec(
                tokens=tokenized.url, out=staging.url, groups=groups, size_limit=config.size_limit
            ),
        )
        fan_out(context, runner, f"mds-{version}", spec_url, len(groups))
        store.fs.rm(f"{staging.url}/_work", recursive=True)
        results = _merge(context, staging, store.is_local, count, version, tokenized.metadata)
        # A function of the inputs: the same samples in the same order whatever the slicing.
        staging.data_version = inputs_digest(
            tokenized.data_version, str(config.size_limit), "merged-v1"
        )
        staging.metadata = {s: r.samples for s, r in results.items()}
        if "labels" in tokenized.metadata:  # label ids in the shards index this label set
            staging.metadata["labels"] = tokenized.metadata["labels"]
    return dg.MaterializeResult(
        metadata=_metadata(staging.url, results),
        data_version=dg.DataVersion(staging.data_version),
    )


def _merge(
    context: dg.AssetExecutionContext,
    staging: Staging,
    is_local: bool,
    count: int,
    version: str,
    tokenized: dict,
) -> dict[str, SplitShards]:
    """The workers' shards merged into one MDS dataset per split, each read back where it is local,
    and as many samples as ``tokenized`` (its metadata) has rows.
    """
    merged = slices.merge_shards(staging.url, staging.local_dir, count)
    results = {s: SplitShards(split=s, **m) for s, m in merged.items()}
    for split, r in results.items():
        context.log.info(f"{split}: {r.samples} samples in {r.shards} shards")
        seen = read_back_count(staging.local_dir / split) if is_local else r.samples
        if seen != r.samples:
            raise dg.Failure(
                f"mds_shards[{version}] {split}: wrote {r.samples} samples, read back {seen}"
            )
    rows = tokenized.get("rows")
    if rows is not None and sum(r.samples for r in results.values()) != rows:
        raise dg.Failure(
            f"mds_shards[{version}]: {sum(r.samples for r in results.values())} samples "
            f"written, tokenized_reviews has {rows} rows"
        )
    return results


def _metadata(url: str, results: dict[str, SplitShards]) -> dict:
    return {
        "path": dg.MetadataValue.path(url),
        "compression": COMPRESSION,
        "dagster/row_count": sum(r.samples for r in results.values()),
        "splits": markdown_table(
            ("split", "samples", "shards", "bytes"),
            [(s, r.samples, r.shards, r.bytes) for s, r in results.items()],
        ),
        "samples_per_split": dg.MetadataValue.json({s: r.samples for s, r in results.items()}),
        # label id -> samples per split, also in each split's split_stats.json (finetuned_model
        # puts the train split's into the trainer config)
        "label_counts_per_split": dg.MetadataValue.json(
            {s: r.label_counts for s, r in results.items()}
        ),
        "shards": sum(r.shards for r in results.values()),
        "bytes": sum(r.bytes for r in results.values()),
    }
