"""``tokenized_reviews[v]``: unpadded token ids, integer labels and a stable split, as Arrow IPC."""


import json
from typing import ClassVar

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field

from finetune_assets.assets._common import OWNERS, markdown_table, version_of
from finetune_assets.assets.pretrained import pretrained_model
from finetune_assets.assets.raw import REVIEWS_FILE, raw_reviews
from finetune_assets.data.labels import labels_from_metadata
from finetune_assets.data.models import position_limit
from finetune_assets.data.tokenize import SPLITS, SplitRule, length_stats, tokenize_table
from finetune_assets.partitions import dataset_versions
from finetune_assets.resources.storage import StorageResource
from finetune_assets.storage import hash_tree

TOKENS_FILE = "tokens.arrow"


class TokenizeConfig(dg.Config):
    unversioned: ClassVar[tuple[str, ...]] = ("batch_size",)  # same tokens whatever the batch (staleness.py)

    max_length: int = Field(512, description="truncate longer reviews to this many tokens (incl. specials)")
    validation_fraction: float = Field(0.1, description="share of reviews (by text hash) in validation")
    test_fraction: float = Field(0.1, description="share of reviews (by text hash) in test")
    batch_size: int = Field(2048, description="texts per fast-tokenizer batch")


def read_tokens(url: str, fs) -> pa.Table:
    with fs.open(f"{url}/{TOKENS_FILE}", "rb") as f:
        return pa.ipc.open_file(pa.BufferReader(f.read())).read_all()


@dg.asset(
    partitions_def=dataset_versions,
    deps=[raw_reviews, pretrained_model],
    group_name="reviews",
    kinds={"arrow", "huggingface"},
    owners=OWNERS,
    code_version="1",
)
def tokenized_reviews(context: dg.AssetExecutionContext, config: TokenizeConfig,
                      storage: StorageResource) -> dg.MaterializeResult:
    """Token ids per review (unpadded), label id and a train/validation/test split fixed by the text's hash."""
    from transformers import AutoConfig, AutoTokenizer

    version = version_of(context)
    store = storage.storage()
    raw = store.require("raw_reviews", version)
    model = store.pinned("pretrained_model", context.run.run_id)  # the run's base model, leased (issue 17)
    with store.fs.open(f"{raw.url}/{REVIEWS_FILE}", "rb") as f:
        accepted = pq.read_table(f)
    with store.local_copy(model.url) as model_dir:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, use_fast=True, trust_remote_code=False)
        model_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    # Never longer than the model's position embeddings allow (a tokenizer's model_max_length may be unset).
    max_length = min(config.max_length, position_limit(model_config))
    if 0 < (getattr(tokenizer, "model_max_length", 0) or 0) < max_length:
        max_length = int(tokenizer.model_max_length)
    labels = labels_from_metadata(raw.metadata)

    def progress(done: int, total: int) -> None:
        context.log.info(f"tokenized {done}/{total} reviews")

    table = tokenize_table(accepted, tokenizer, max_length,
                           SplitRule(config.validation_fraction, config.test_fraction),
                           batch_size=config.batch_size, progress=progress, labels=labels)
    stats = length_stats(table, max_length)
    splits = table.column("split").cast(pa.string())
    counts = {s: int(pc.sum(pc.equal(splits, s)).as_py() or 0) for s in SPLITS}
    with store.publish("tokenized_reviews", version) as staging:
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_file(str(staging.local_dir / TOKENS_FILE), table.schema, options=options) as w:
            w.write_table(table)
        (staging.local_dir / "stats.json").write_text(json.dumps({"splits": counts, "lengths": stats}))
        (staging.local_dir / "labels.json").write_text(json.dumps(labels.to_dict(), ensure_ascii=False))
        staging.data_version = hash_tree(staging.local_dir)
        staging.metadata = {"rows": table.num_rows, "max_length": max_length, "labels": labels.to_dict()}
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(f"{staging.url}/{TOKENS_FILE}"),
            "dagster/row_count": table.num_rows,
            "rows_per_split": markdown_table(("split", "reviews"), list(counts.items())),
            "split_counts": dg.MetadataValue.json(counts),
            "max_length": max_length,
            "labels": ", ".join(f"{i}={n}" for i, n in labels.id2label.items()),
            "token_dtype": str(table.column("input_ids").type.value_type),
            "tokens_mean": stats["mean"],
            "tokens_p50": stats["p50"],
            "tokens_p95": stats["p95"],
            "tokens_max": stats["max"],
            "truncated_share": stats["truncated_share"],
            **_pictures(context, table, max_length),
        },
        data_version=dg.DataVersion(staging.data_version),
    )


# -- pictures for the UI (finetune_assets.viz) ----------------------------------------------------
def _pictures(context: dg.AssetExecutionContext, table: pa.Table, max_length: int) -> dict[str, dg.MetadataValue]:
    """The token-length histogram; a plotting failure never fails the materialization."""
    from finetune_assets import viz

    try:
        lengths = table.column("full_length").to_numpy()
        return {"token_lengths": dg.MetadataValue.md(viz.token_length_md(lengths, max_length))}
    except Exception as err:  # noqa: BLE001 - a missing picture is not worth a failed run
        context.log.warning(f"token length histogram skipped: {err}")
        return {}
