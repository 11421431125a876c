"""The tokenize slice worker: row groups of ``reviews.parquet`` -> one token part (+ its stats
JSON).

Cached rows come from the token cache (searched memory-mapped), the others are tokenized and added
to it as one segment when the slice is done. Dagster-free (test_layers.py).
"""

from __future__ import annotations

import contextlib
import time

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tokenizers

from finetune_assets.core.io.contracts import SPLITS
from finetune_assets.core.io.primitives import staged_file
from finetune_assets.core.labels.infer import LabelSet
from finetune_assets.core.prep.token_cache import Hits, TokenCache, text_keys
from finetune_assets.core.prep.tokenize import (
    encode_texts,
    label_ids,
    length_histogram,
    token_batch,
)
from finetune_assets.core.prep.validate import split_column
from finetune_assets.core.shards.plan import PARTS, TokenizeSpec, _put_json, part_name


def tokenize_group(spec: TokenizeSpec, index: int, log=print) -> list[dict]:
    """Index ``index`` of a tokenize fan-out: its slices one after the other, each its own part (a
    worker pays its imports once, however many slices it takes; a slice bounds its memory).
    """
    # one per worker: a remote index is downloaded once
    cache = TokenCache(spec.cache) if spec.cache else None
    return [tokenize_slice(spec, i, log, cache) for i in spec.slices_of(index)]


def tokenize_slice(spec: TokenizeSpec, index: int, log=print, cache=None) -> dict:
    """Slice ``index`` (row groups of ``reviews.parquet``) as one token part,
    ``parts/{name}.arrow``, and its stats beside it: rows, how many came from the token cache,
    rows per split, the token length histogram, seconds. The stats are returned too.

    ``cache``: the worker's :class:`TokenCache` (opened here from ``spec.cache`` when not given).
    """
    t0 = time.perf_counter()
    start, stop = spec.slices[index]
    groups = list(range(start, stop))
    dtype = np.dtype(spec.dtype)
    labels = LabelSet.from_dict(spec.labels)
    backend = _tokenizer(spec.tokenizer)
    if cache is None and spec.cache:
        cache = TokenCache(spec.cache)
    fs, path = fsspec.core.url_to_fs(spec.reviews)
    with fs.open(path, "rb") as raw_file:
        reviews = pq.ParquetFile(raw_file)
        keys, hits, where = _cache_hits(reviews, groups, spec.batch_size, cache, dtype)
        hist = np.zeros(0, dtype=np.int64)
        split_counts = dict.fromkeys(SPLITS, 0)
        row = new_count = 0
        # rows tokenized anew go to the cache batch by batch, published as one segment when the
        # slice is done
        with (
            staged_file(f"{spec.out}/{PARTS}/{part_name(index)}.arrow") as local,
            cache.segment() if cache is not None else contextlib.nullcontext() as segment,
        ):
            options = pa.ipc.IpcWriteOptions(compression="zstd")
            writer = None
            batches = reviews.iter_batches(
                batch_size=spec.batch_size, row_groups=groups, columns=["text", "label", "split"]
            )
            for batch in batches:
                n = batch.num_rows
                texts = batch.column("text").to_pylist()
                at = where[row : row + n] if where is not None else np.full(n, -1, dtype=np.int64)
                ids, full, miss = _encode(backend, texts, at, hits, spec.max_length, dtype)
                new_count += len(miss)
                if segment is not None and len(miss):
                    fresh_ids = ids.take(pa.array(miss)) if len(miss) < n else ids
                    fresh_keys = (
                        keys[row + miss]
                        if hits is not None
                        else text_keys([texts[j] for j in miss])
                    )
                    segment.write(fresh_keys, fresh_ids, full[miss])
                splits = split_column(pa.Table.from_batches([batch]))  # raw_reviews stored it
                out = token_batch(
                    ids, full, label_ids(batch.column("label"), labels), splits, dtype
                )
                if writer is None:
                    writer = pa.ipc.new_file(str(local), out.schema, options=options)
                writer.write_batch(out)
                hist = _summed(hist, length_histogram(full))
                for s, c in zip(
                    *np.unique(out.column("split").indices.to_numpy(), return_counts=True)
                ):
                    split_counts[SPLITS[s]] += int(c)
                row += n
            if writer is None:  # an empty slice still has a (schema-only) part
                writer = pa.ipc.new_file(str(local), _empty_part(dtype).schema, options=options)
            writer.close()
    stats = {
        "rows": row,
        "reused": row - new_count,
        "new": new_count,
        "splits": split_counts,
        "length_histogram": hist.tolist(),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    _put_json(f"{spec.out}/{PARTS}/{part_name(index)}.json", stats)
    log(
        f"slice {index}: {row} rows tokenized ({stats['reused']} from the cache) in "
        f"{stats['seconds']} s"
    )
    return stats


def _tokenizer(url: str) -> tokenizers.Tokenizer:
    """The fast tokenizer saved at ``url`` (``tokenizer.json``), whole: no truncation or padding
    (the full lengths are counted; :func:`encode_texts` truncates).
    """
    with fsspec.open(url, "r", encoding="utf-8") as f:
        backend = tokenizers.Tokenizer.from_str(f.read())
    backend.no_truncation()
    backend.no_padding()
    return backend


def _cache_hits(
    reviews: pq.ParquetFile,
    groups: list[int],
    batch_size: int,
    cache: TokenCache | None,
    dtype: np.dtype,
) -> tuple[np.ndarray | None, Hits | None, np.ndarray | None]:
    """The slice's text keys, what the cache holds of them, and per slice row the index into the
    hits' compact token array (-1: tokenize it); all None without a cache segment to look in.
    """
    # A cache with no segment yet (a first version) is not looked up: no first pass over the texts.
    if cache is None or not cache.has_segments():
        return None, None, None
    keys = np.concatenate(
        [
            text_keys(b.column(0).to_pylist())
            for b in reviews.iter_batches(
                batch_size=batch_size, row_groups=groups, columns=["text"]
            )
        ]
        or [np.empty((0, 16), np.uint8)]
    )
    hits = cache.lookup(keys, dtype)
    where = None
    if len(hits.rows):
        where = np.full(len(keys), -1, dtype=np.int64)
        where[hits.rows] = np.arange(len(hits.rows))
    return keys, hits, where


def _encode(
    backend: tokenizers.Tokenizer,
    texts: list[str],
    at: np.ndarray,
    hits: Hits | None,
    max_length: int,
    dtype: np.dtype,
) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """A batch's token ids and full lengths in row order: rows the cache holds (``at`` >= 0, their
    index into ``hits``) taken from it, the others tokenized; and those others' positions.
    """
    n = len(texts)
    miss = np.flatnonzero(at < 0)
    if len(miss) == n:
        ids, full = encode_texts(backend, texts, max_length, dtype)
        return ids, full, miss
    # cached rows and new ones, put back in row order with one take
    fresh, fresh_full = encode_texts(backend, [texts[j] for j in miss], max_length, dtype)
    hit = np.flatnonzero(at >= 0)
    position = np.empty(n, dtype=np.int64)
    position[miss] = np.arange(len(miss))
    position[hit] = len(miss) + np.arange(len(hit))
    both = pa.concat_arrays([fresh, hits.ids.take(pa.array(at[hit]))])
    full = np.concatenate([fresh_full, hits.full[at[hit]]])[position]
    return both.take(pa.array(position)), full, miss


def _summed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two length histograms added bin by bin (the shorter padded with zeros)."""
    return np.pad(a, (0, max(0, len(b) - len(a)))) + np.pad(b, (0, max(0, len(a) - len(b))))


def _empty_part(dtype: np.dtype) -> pa.RecordBatch:
    """A part's batch with no rows: the schema an empty slice's part still has."""
    return token_batch(
        pa.array([], pa.list_(pa.from_numpy_dtype(dtype))),
        [],
        np.empty(0, np.int8),
        pa.array([], pa.string()),
        dtype,
    )
