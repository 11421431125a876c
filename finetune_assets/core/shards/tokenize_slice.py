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

from finetune_assets.core.io.contracts import SPLITS
from finetune_assets.core.io.primitives import staged_file
from finetune_assets.core.labels.infer import LabelSet
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
    from finetune_assets.core.prep.token_cache import TokenCache

    # one per worker: a remote index is downloaded once
    cache = TokenCache(spec.cache) if spec.cache else None
    return [tokenize_slice(spec, i, log, cache) for i in spec.slices_of(index)]


def tokenize_slice(spec: TokenizeSpec, index: int, log=print, cache=None) -> dict:
    import tokenizers

    from finetune_assets.core.prep.token_cache import TokenCache, text_keys

    t0 = time.perf_counter()
    start, stop = spec.slices[index]
    groups = list(range(start, stop))
    dtype = np.dtype(spec.dtype)
    labels = LabelSet.from_dict(spec.labels)
    with fsspec.open(spec.tokenizer, "r", encoding="utf-8") as f:
        backend = tokenizers.Tokenizer.from_str(f.read())
    backend.no_truncation()
    backend.no_padding()
    if cache is None and spec.cache:
        cache = TokenCache(spec.cache)
    fs, path = fsspec.core.url_to_fs(spec.reviews)
    with fs.open(path, "rb") as raw_file:
        reviews = pq.ParquetFile(raw_file)
        # A cache with no segment yet (a first version) is not looked up: no first pass over the
        # texts.
        hits = None
        if cache is not None and cache.has_segments():
            keys = np.concatenate(
                [
                    text_keys(b.column(0).to_pylist())
                    for b in reviews.iter_batches(
                        batch_size=spec.batch_size, row_groups=groups, columns=["text"]
                    )
                ]
                or [np.empty((0, 16), np.uint8)]
            )
            hits = cache.lookup(keys, dtype)
        # slice row -> index into the hits' compact token array (-1: tokenize it)
        where = None
        if hits is not None and len(hits.rows):
            where = np.full(len(keys), -1, dtype=np.int64)
            where[hits.rows] = np.arange(len(hits.rows))
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
                miss = np.flatnonzero(at < 0)
                if len(miss) == n:
                    ids, full = encode_texts(backend, texts, spec.max_length, dtype)
                else:  # cached rows and new ones, put back in row order with one take
                    fresh, fresh_full = encode_texts(
                        backend, [texts[j] for j in miss], spec.max_length, dtype
                    )
                    hit = np.flatnonzero(at >= 0)
                    position = np.empty(n, dtype=np.int64)
                    position[miss] = np.arange(len(miss))
                    position[hit] = len(miss) + np.arange(len(hit))
                    both = pa.concat_arrays([fresh, hits.ids.take(pa.array(at[hit]))])
                    ids = both.take(pa.array(position))
                    full = np.concatenate([fresh_full, hits.full[at[hit]]])[position]
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
                h = length_histogram(full)
                hist = np.pad(hist, (0, max(0, len(h) - len(hist)))) + np.pad(
                    h, (0, max(0, len(hist) - len(h)))
                )
                for s, c in zip(
                    *np.unique(out.column("split").indices.to_numpy(), return_counts=True)
                ):
                    split_counts[SPLITS[s]] += int(c)
                row += n
            if writer is None:  # an empty slice still has a (schema-only) part
                empty = token_batch(
                    pa.array([], pa.list_(pa.from_numpy_dtype(dtype))),
                    [],
                    np.empty(0, np.int8),
                    pa.array([], pa.string()),
                    dtype,
                )
                writer = pa.ipc.new_file(str(local), empty.schema, options=options)
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
