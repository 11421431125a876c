"""``mds_shards[v]``: one MosaicML MDS dataset per split, verified by reading it back."""


import dagster as dg
from pydantic import Field

from finetune_assets.assets._common import OWNERS, markdown_table, version_of
from finetune_assets.assets.tokenized import tokenized_reviews
from finetune_assets.contracts import MDS_SHARDS, TOKENIZED_REVIEWS, read_tokens
from finetune_assets.data.shards import COMPRESSION, read_back_count, write_splits
from finetune_assets.partitions import dataset_versions
from finetune_assets.resources.storage import StorageResource
from finetune_assets.storage import hash_tree


class ShardsConfig(dg.Config):
    size_limit: str = Field("64mb", description="maximum bytes per shard before compression")


@dg.asset(
    partitions_def=dataset_versions,
    deps=[tokenized_reviews],
    group_name="reviews",
    kinds={"mosaicml"},
    owners=OWNERS,
    code_version="1",
)
def mds_shards(context: dg.AssetExecutionContext, config: ShardsConfig,
               storage: StorageResource) -> dg.MaterializeResult:
    """MDS shards (zstd) per split, streamable with StreamingDataset from the storage root."""
    version = version_of(context)
    store = storage.storage()
    tokenized = store.require(TOKENIZED_REVIEWS, version)
    tokens = read_tokens(tokenized.url, store.fs)
    with store.publish(MDS_SHARDS, version) as staging:
        results = write_splits(tokens, staging.local_dir, config.size_limit,
                               progress=lambda split, n: context.log.info(f"{split}: wrote {n} samples"))
        for split, r in results.items():
            seen = read_back_count(staging.local_dir / split)
            if seen != r.samples:
                raise dg.Failure(f"mds_shards[{version}] {split}: wrote {r.samples} samples, read back {seen}")
        staging.data_version = hash_tree(staging.local_dir)
        staging.metadata = {s: r.samples for s, r in results.items()}
        if "labels" in tokenized.metadata:  # label ids in the shards index this label set
            staging.metadata["labels"] = tokenized.metadata["labels"]
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(staging.url),
            "compression": COMPRESSION,
            "dagster/row_count": sum(r.samples for r in results.values()),
            "splits": markdown_table(("split", "samples", "shards", "bytes"),
                                     [(s, r.samples, r.shards, r.bytes) for s, r in results.items()]),
            "samples_per_split": dg.MetadataValue.json({s: r.samples for s, r in results.items()}),
            # label id -> samples per split, also in each split's split_stats.json (finetuned_model puts the train
            # split's into the trainer config)
            "label_counts_per_split": dg.MetadataValue.json({s: r.label_counts for s, r in results.items()}),
            "shards": sum(r.shards for r in results.values()),
            "bytes": sum(r.bytes for r in results.values()),
        },
        data_version=dg.DataVersion(staging.data_version),
    )
