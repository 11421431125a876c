"""``tokenized_reviews[v]``: unpadded token ids, integer labels and raw_reviews' split, as Arrow
IPC.
"""

import json
import re
from typing import ClassVar

import dagster as dg
import pyarrow.parquet as pq
from pydantic import Field

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
from finetune_assets.core.labels.infer import labels_from_metadata
from finetune_assets.core.launchers.base import TrainingLauncher
from finetune_assets.core.prep.tokenize import stats_from_histogram, token_dtype
from finetune_assets.defs.common import launch_labels, markdown_table, version_asset, version_of
from finetune_assets.defs.data.pretrained import pretrained_model
from finetune_assets.defs.data.raw import raw_reviews
from finetune_assets.defs.provenance import input_tags, read_recorded, run_group_id
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
    from finetune_assets.core.launchers.select import fanout_runner
    from finetune_assets.core.prep.pretrained import load_tokenization
    from finetune_assets.core.prep.token_cache import CACHE_DIR, tokenizer_hash
    from finetune_assets.core.shards import slices

    version = version_of(context)
    store = storage.storage()
    raw = read_recorded(context.instance, store, RAW_REVIEWS, version)  # storage repaired if ahead
    # The root run's base model, leased: a re-execution tokenizes (and trains) with the same one.
    model = store.pinned(PRETRAINED_MODEL, run_group_id(context.run))
    tokenization = read_tokenization(model.url, store.fs)
    if tokenization is None:  # published before tokenization.json: load it the slow way
        with store.local_copy(model.url) as model_dir:
            tokenization = load_tokenization(str(model_dir))
    # Never longer than the model takes (position embeddings, the tokenizer's model_max_length).
    max_length = min(config.max_length, tokenization.max_input_tokens)
    if max_length < 2:
        raise dg.Failure("max_length must be at least 2 (room for [CLS] and [SEP])")
    labels = labels_from_metadata(raw.metadata)
    tokenizer_json = tokenization.tokenizer_json
    tok_hash = tokenizer_hash(tokenizer_json)
    reviews_url = f"{raw.url}/{REVIEWS_FILE}"  # with the split raw_reviews assigned
    with store.fs.open(reviews_url, "rb") as f:
        meta = pq.ParquetFile(f).metadata
        group_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
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
            dtype=token_dtype(tokenization.vocab_size).name,
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
        _fan_out(context, runner, f"tok-{version}", f"{work}/spec.json", spec.count)
        parts = slices.read_part_stats(staging.url, len(plan))
        store.fs.rm(work, recursive=True)  # tokenizer + spec: inputs of the workers, not data
        index = _index_cache(context, spec.cache)
        rows = sum(p["rows"] for p in parts)
        if rows != raw.metadata.get("rows", rows):
            raise dg.Failure(
                f"tokenized_reviews[{version}]: slices tokenized {rows} rows, raw_reviews has "
                f"{raw.metadata['rows']}"
            )
        hist = _merged_histogram(parts)
        stats = stats_from_histogram(hist, max_length)
        counts = {s: sum(p["splits"][s] for p in parts) for s in SPLITS}
        reused = sum(p["reused"] for p in parts)
        (staging.local_dir / TOKEN_STATS_FILE).write_text(
            TokenStats(splits=counts, lengths=stats).to_json()
        )
        (staging.local_dir / LABELS_FILE).write_text(
            json.dumps(labels.to_dict(), ensure_ascii=False)
        )
        # A function of the inputs (the output is deterministic in them), so it is the same whatever
        # the slicing.
        staging.data_version = _digest(
            raw.data_version, tok_hash, max_length, labels.to_dict(), "parts-v1"
        )
        staging.metadata = {
            "rows": rows,
            "max_length": max_length,
            "labels": labels.to_dict(),
            "parts": len(plan),
            "reused_rows": reused,
            "new_rows": rows - reused,
        }
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(f"{staging.url}/{TOKEN_PARTS_DIR}"),
            "dagster/row_count": rows,
            "rows_per_split": markdown_table(("split", "reviews"), list(counts.items())),
            "split_counts": dg.MetadataValue.json(counts),
            "max_length": max_length,
            "labels": ", ".join(f"{i}={n}" for i, n in labels.id2label.items()),
            "token_dtype": spec.dtype,
            "tokens_mean": stats["mean"],
            "tokens_p50": stats["p50"],
            "tokens_p95": stats["p95"],
            "tokens_max": stats["max"],
            "truncated_share": stats["truncated_share"],
            "slices": len(plan),
            "reused_rows": reused,
            "new_rows": rows - reused,
            **index,
            "tokenizer_hash": tok_hash,
            **_pictures(context, hist, max_length),
        },
        data_version=dg.DataVersion(staging.data_version),
        # The base model read, not the newest.
        tags=input_tags(context.instance, PRETRAINED_MODEL, model),
    )


def _fan_out(
    context: dg.AssetExecutionContext, runner, kind: str, spec_url: str, count: int
) -> None:
    """Run the slice workers; a failed slice fails the step (and nothing is published)."""
    from finetune_assets.core.launchers.fanout import FanOut, FanOutError, python_module
    from finetune_assets.core.shards.slices import WORKER_ENV

    # DNS-1123 (a Kubernetes Job name): lower-case alphanumerics and "-", <= 52 characters, the run
    # id kept
    name = re.sub(r"[^a-z0-9-]+", "-", f"{kind}-{context.run.run_id[:8]}".lower())[-52:].strip("-")
    # code: the same interpreter/image, cwd and PYTHONPATH
    job = FanOut(
        name=name,
        command=python_module("finetune_assets.core.shards.slices", "work", "--spec", spec_url),
        count=count,
        env=dict(WORKER_ENV),
    )
    try:
        runner.run(job, context.log.info)
    except FanOutError as err:
        raise dg.Failure(str(err)) from err


def _index_cache(context: dg.AssetExecutionContext, cache_url: str | None) -> dict:
    """Merge this version's new cache segments into the cache's index, so the next version's lookups
    are one binary search per row. The cache only speeds things up: a failed merge is a warning (the
    segments stay searchable one by one), never a failed version.
    """
    if cache_url is None:
        return {}
    from finetune_assets.core.prep.token_cache import TokenCache

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
    import numpy as np

    width = max((len(p["length_histogram"]) for p in parts), default=0)
    hist = np.zeros(width, dtype=np.int64)
    for p in parts:
        h = p["length_histogram"]
        hist[: len(h)] += h
    return hist


def _digest(*parts) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# -- pictures for the UI (finetune_assets.core.evaluation.charts)
# ----------------------------------------------------
def _pictures(
    context: dg.AssetExecutionContext, hist, max_length: int
) -> dict[str, dg.MetadataValue]:
    """The token-length histogram; a plotting failure never fails the materialization."""
    import numpy as np

    from finetune_assets.core.evaluation import charts as viz

    try:
        # the merged histogram as values, thinned to <= 200k (the picture's shape, bounded memory)
        step = max(1, int(hist.sum()) // 200_000)
        lengths = np.repeat(np.arange(len(hist)), hist // step + (hist % step > 0))
        return {"token_lengths": dg.MetadataValue.md(viz.token_length_md(lengths, max_length))}
    except Exception as err:  # a missing picture is not worth a failed run
        context.log.warning(f"token length histogram skipped: {err}")
        return {}
