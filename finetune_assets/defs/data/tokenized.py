"""``tokenized_reviews[v]``: unpadded token ids, integer labels and raw_reviews' split, as Arrow
IPC.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
from pydantic import Field

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.io.contracts import (
    LABELS_FILE,
    PRETRAINED_MODEL,
    RAW_REVIEWS,
    REVIEWS_FILE,
    SPLITS,
    TOKEN_PARTS_DIR,
    TOKEN_STATS_FILE,
    TOKENIZED_REVIEWS,
    TokenStats,
    read_tokenization,
)
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.labels.infer import LabelSet, labels_from_metadata
from finetune_assets.core.prep.pretrained import load_tokenization
from finetune_assets.core.prep.token_cache import CACHE_DIR, TokenCache, tokenizer_hash
from finetune_assets.core.prep.tokenize import stats_from_histogram, token_dtype
from finetune_assets.core.shards import slices
from finetune_assets.defs.common import launch_labels, markdown_table, version_asset, version_of
from finetune_assets.defs.data.pretrained import pretrained_model
from finetune_assets.defs.data.raw import raw_reviews
from finetune_assets.defs.data.slice_workers import fan_out, inputs_digest
from finetune_assets.defs.provenance import input_tags, read_recorded, run_group_id
from finetune_assets.defs.resources.launchers import TrainingLauncher
from finetune_assets.defs.resources.storage_root import StorageResource


class TokenizeConfig(dg.Config):
    # Same tokens whatever the batch, slicing, worker count or cache (defs/staleness.py;
    # tests/data/test_slices.py).
    unversioned: ClassVar[tuple[str, ...]] = ("batch_size", "workers", "slice_rows", "cache")

    max_length: int = Field(
        512, description="truncate longer reviews to this many tokens (incl. specials)"
    )
    batch_size: int = Field(2048, description="texts per fast-tokenizer batch")
    workers: int | None = Field(
        None,
        description="slice worker processes at a time (local runner); default: the usable cores",
    )
    slice_rows: int = Field(
        65_536,
        description="at most this many rows per slice (bounds a worker's memory); "
        "a worker tokenizes several slices in turn",
    )
    cache: bool = Field(
        True, description="reuse tokens of rows an earlier version tokenized ({root}/token_cache)"
    )


@version_asset(
    "reviews", {"arrow", "huggingface"}, deps=[raw_reviews, pretrained_model], code_version="1"
)
def tokenized_reviews(
    context: dg.AssetExecutionContext,
    config: TokenizeConfig,
    storage: StorageResource,
    launcher: TrainingLauncher,
) -> dg.MaterializeResult:
    """Token ids per review (unpadded), label id and the train/validation/test split raw_reviews
    assigned.

    Tokenized by slice workers (``core/shards/slices.py``), one part per slice in ``parts/``, in
    row order.
    """
    from finetune_assets.core.launchers.fanout import runner_width
    from finetune_assets.defs.resources.launchers import fanout_runner

    version = version_of(context)
    store = storage.storage()
    raw = read_recorded(context.instance, store, RAW_REVIEWS, version)  # storage repaired if ahead
    # The root run's base model, leased: a re-execution tokenizes (and trains) with the same one.
    model = store.pinned(PRETRAINED_MODEL, run_group_id(context.run))
    tokenizer_json, vocab_size, max_length = _tokenizer(store, model.url, config.max_length)
    labels = labels_from_metadata(raw.metadata)
    tok_hash = tokenizer_hash(tokenizer_json)
    reviews_url = f"{raw.url}/{REVIEWS_FILE}"  # with the split raw_reviews assigned
    group_rows = _rows_per_group(store, reviews_url)
    runner = fanout_runner(
        launcher,
        workers=config.workers,
        labels=launch_labels(context, TOKENIZED_REVIEWS, version),
        instance=context.instance,
    )
    plan = slices.plan_slices(group_rows, runner_width(runner) or 1, config.slice_rows)
    with store.publish(TOKENIZED_REVIEWS, version) as staging:
        work = f"{staging.url}/_work"
        store.write_atomic(f"{work}/tokenizer.json", tokenizer_json.encode())
        spec = slices.TokenizeSpec(
            reviews=reviews_url,
            out=staging.url,
            slices=plan,
            tokenizer=f"{work}/tokenizer.json",
            dtype=token_dtype(vocab_size).name,
            max_length=max_length,
            labels=labels.to_dict(),
            batch_size=config.batch_size,
            cache=store.url(CACHE_DIR, f"{tok_hash}-{max_length}") if config.cache else None,
            groups=slices.group_parts(len(plan), runner_width(runner) or len(plan)),
        )
        slices.write_spec(f"{work}/spec.json", spec)
        context.log.info(
            f"tokenizing {sum(group_rows)} reviews in {len(plan)} slices by {spec.count} workers"
        )
        fan_out(context, runner, f"tok-{version}", f"{work}/spec.json", spec.count)
        parts = slices.read_part_stats(staging.url, len(plan))
        store.fs.rm(work, recursive=True)  # tokenizer + spec: inputs of the workers, not data
        index = _index_cache(context, spec.cache)
        tally = _tally(parts, raw.metadata, version)
        stats = _write_stats(staging.local_dir, tally, max_length, labels)
        # A function of the inputs (the output is deterministic in them), so it is the same whatever
        # the slicing.
        staging.data_version = inputs_digest(
            raw.data_version, tok_hash, max_length, labels.to_dict(), "parts-v1"
        )
        staging.metadata = {
            "rows": tally.rows,
            "max_length": max_length,
            "labels": labels.to_dict(),
            "parts": len(plan),
            "reused_rows": tally.reused,
            "new_rows": tally.rows - tally.reused,
        }
    return dg.MaterializeResult(
        metadata=_metadata(context, staging.url, spec, labels, tally, stats, index, tok_hash),
        data_version=dg.DataVersion(staging.data_version),
        # The base model read, not the newest.
        tags=input_tags(context.instance, PRETRAINED_MODEL, model),
    )


def _tokenizer(store: Storage, model_url: str, max_length: int) -> tuple[str, int, int]:
    """The base model's tokenizer (its JSON), vocabulary size and the max length to cut at: never
    longer than the model takes (position embeddings, the tokenizer's model_max_length).
    """
    tokenization = read_tokenization(model_url, store.fs)
    if tokenization is None:  # published before tokenization.json: load it the slow way
        with store.local_copy(model_url) as model_dir:
            tokenization = load_tokenization(str(model_dir))
    max_length = min(max_length, tokenization.max_input_tokens)
    if max_length < 2:
        raise dg.Failure("max_length must be at least 2 (room for [CLS] and [SEP])")
    return tokenization.tokenizer_json, tokenization.vocab_size, max_length


def _rows_per_group(store: Storage, url: str) -> list[int]:
    """Rows per row group of a Parquet file (raw_reviews' row groups: the unit slices cut at)."""
    with store.fs.open(url, "rb") as f:
        meta = pq.ParquetFile(f).metadata
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


@dataclass(frozen=True)
class _Tally:
    """What the slices tokenized, summed over their parts."""

    rows: int
    splits: dict[str, int]
    reused: int  # rows whose tokens came from the cache
    histogram: np.ndarray  # token length -> reviews


def _tally(parts: list[dict], raw_metadata: dict, version: str) -> _Tally:
    rows = sum(p["rows"] for p in parts)
    if rows != raw_metadata.get("rows", rows):
        raise dg.Failure(
            f"tokenized_reviews[{version}]: slices tokenized {rows} rows, raw_reviews has "
            f"{raw_metadata['rows']}"
        )
    return _Tally(
        rows=rows,
        splits={s: sum(p["splits"][s] for p in parts) for s in SPLITS},
        reused=sum(p["reused"] for p in parts),
        histogram=_merged_histogram(parts),
    )


def _write_stats(folder: Path, tally: _Tally, max_length: int, labels: LabelSet) -> dict:
    """Token statistics (per split, token lengths) and the label set beside the parts; the
    length statistics back.
    """
    stats = stats_from_histogram(tally.histogram, max_length)
    (folder / TOKEN_STATS_FILE).write_text(TokenStats(splits=tally.splits, lengths=stats).to_json())
    (folder / LABELS_FILE).write_text(json.dumps(labels.to_dict(), ensure_ascii=False))
    return stats


def _metadata(
    context: dg.AssetExecutionContext,
    url: str,
    spec: slices.TokenizeSpec,
    labels: LabelSet,
    tally: _Tally,
    stats: dict,
    index: dict,
    tokenizer: str,
) -> dict:
    return {
        "path": dg.MetadataValue.path(f"{url}/{TOKEN_PARTS_DIR}"),
        "dagster/row_count": tally.rows,
        "rows_per_split": markdown_table(("split", "reviews"), list(tally.splits.items())),
        "split_counts": dg.MetadataValue.json(tally.splits),
        "max_length": spec.max_length,
        "labels": ", ".join(f"{i}={n}" for i, n in labels.id2label.items()),
        "token_dtype": spec.dtype,
        "tokens_mean": stats["mean"],
        "tokens_p50": stats["p50"],
        "tokens_p95": stats["p95"],
        "tokens_max": stats["max"],
        "truncated_share": stats["truncated_share"],
        "slices": len(spec.slices),
        "reused_rows": tally.reused,
        "new_rows": tally.rows - tally.reused,
        **index,
        "tokenizer_hash": tokenizer,
        **_pictures(context, tally.histogram, spec.max_length),
    }


def _index_cache(context: dg.AssetExecutionContext, cache_url: str | None) -> dict:
    """Merge this version's new cache segments into the cache's index, so the next version's lookups
    are one binary search per row. The cache only speeds things up: a failed merge is a warning (the
    segments stay searchable one by one), never a failed version.
    """
    if cache_url is None:
        return {}
    try:
        counts = TokenCache(cache_url).compact()
    except Exception as err:  # see above
        context.log.warning(
            f"token cache index not updated ({type(err).__name__}: {err}); "
            "the next version searches its segments one by one"
        )
        return {}
    return {"token_cache_index_rows": counts["index_rows"]}


def _merged_histogram(parts: list[dict]):
    width = max((len(p["length_histogram"]) for p in parts), default=0)
    hist = np.zeros(width, dtype=np.int64)
    for p in parts:
        h = p["length_histogram"]
        hist[: len(h)] += h
    return hist


# -- pictures for the UI (finetune_assets.core.evaluation.charts)
# ----------------------------------------------------
def _pictures(
    context: dg.AssetExecutionContext, hist, max_length: int
) -> dict[str, dg.MetadataValue]:
    """The token-length histogram; a plotting failure never fails the materialization."""
    try:
        # the merged histogram as values, thinned to <= 200k (the picture's shape, bounded memory)
        step = max(1, int(hist.sum()) // 200_000)
        lengths = np.repeat(np.arange(len(hist)), hist // step + (hist % step > 0))
        return {"token_lengths": dg.MetadataValue.md(viz.token_length_md(lengths, max_length))}
    except Exception as err:  # a missing picture is not worth a failed run
        context.log.warning(f"token length histogram skipped: {err}")
        return {}
