"""Batched fast-tokenizer encoding into unpadded token ids, the token rows' columns and their
length statistics: the pieces of the tokenize slice worker
(:mod:`finetune_assets.core.shards.tokenize_slice`) and of ``tokenized_reviews``' report; the split
comes with the rows from raw_reviews.

Padding is the trainer's job (per batch, to the longest sequence), so nothing is stored padded.
Texts are encoded in full and truncated here, which keeps the original length for the
"truncated share" statistic at no extra cost.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from finetune_assets.core.io.contracts import SPLITS
from finetune_assets.core.labels.infer import LabelSet


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every token id."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def truncate_keeping_specials(
    ids: np.ndarray, special_mask: list[int], max_length: int
) -> np.ndarray:
    """Cut the text, not the model's own special tokens: leading specials (``[CLS]``, ``<s>``) + as
    much text as fits + trailing specials (``[SEP]``, ``</s>``), whatever the tokenizer's
    post-processor added.
    """
    if len(ids) <= max_length:
        return ids
    head = 0
    while head < len(special_mask) and special_mask[head]:
        head += 1
    tail = 0
    while tail < len(special_mask) - head and special_mask[len(special_mask) - 1 - tail]:
        tail += 1
    keep = max_length - head - tail
    if keep < 1:
        raise ValueError(
            f"max_length {max_length} leaves no room for text beside {head + tail} special tokens"
        )
    return (
        np.concatenate([ids[: head + keep], ids[len(ids) - tail :]]) if tail else ids[: head + keep]
    )


def encode_texts(
    backend, texts: list[str], max_length: int, dtype: np.dtype
) -> tuple[pa.ListArray, np.ndarray]:
    """One fast-tokenizer batch: token ids truncated to ``max_length`` keeping specials, and each
    full length.

    ``encode_batch_fast`` (tokenizers >= 0.20) skips the character offsets nothing here uses. The
    ids go into one flat buffer in one pass; only the rows that need truncating are touched one by
    one.
    """
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    encodings = encode(texts)
    rows = [e.ids for e in encodings]
    full = np.fromiter(map(len, rows), dtype=np.int32, count=len(rows))
    for i in np.flatnonzero(full > max_length):
        rows[i] = truncate_keeping_specials(
            np.asarray(rows[i]), encodings[i].special_tokens_mask, max_length
        )
    lengths = np.minimum(full, max_length)
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter(chain.from_iterable(rows), dtype=dtype, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)), full


def label_ids(names: pa.Array | pa.ChunkedArray, labels: LabelSet) -> np.ndarray:
    """Class names (an Arrow string column) -> int8 ids in ``labels``; an unknown name is an
    error.
    """
    names = names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names
    ids = pc.index_in(names, value_set=pa.array(list(labels.names), pa.string()))
    if ids.null_count:
        unknown = sorted(set(pc.filter(names, pc.is_null(ids)).to_pylist()), key=str)
        raise ValueError(
            f"labels {unknown[:10]} are not classes of the version's label set {list(labels.names)}"
        )
    return ids.to_numpy().astype(np.int8)


# one fixed dictionary: batches of one IPC file must share it
SPLIT_DICTIONARY = pa.array(SPLITS, pa.string())


def token_batch(
    ids: pa.ListArray, full_lengths, labels: np.ndarray, splits: pa.Array, dtype: np.dtype
) -> pa.RecordBatch:
    """The tokenized rows' columns: input_ids (list of uint), length, full_length, label id, split
    (``splits``: the plain strings :func:`~finetune_assets.core.prep.validate.split_column` gives).
    """
    ids = ids.cast(pa.list_(pa.from_numpy_dtype(dtype)))
    codes = pc.index_in(splits, value_set=SPLIT_DICTIONARY)
    if codes.null_count:
        raise ValueError(f"split values other than {list(SPLITS)}")
    return pa.RecordBatch.from_arrays(
        [
            ids,
            pc.list_value_length(ids).cast(pa.int32()),
            pa.array(np.asarray(full_lengths, dtype=np.int32)),
            pa.array(np.asarray(labels, dtype=np.int8)),
            pa.DictionaryArray.from_arrays(codes.cast(pa.int8()), SPLIT_DICTIONARY),
        ],
        names=["input_ids", "length", "full_length", "label", "split"],
    )


def length_histogram(full_lengths) -> np.ndarray:
    """Counts per full token length: what :func:`stats_from_histogram` needs, mergeable across
    slices, bounded size.
    """
    return np.bincount(np.asarray(full_lengths, dtype=np.int64))


def stats_from_histogram(hist: np.ndarray, max_length: int) -> dict[str, float]:
    """Token-length statistics (mean, median, 95th percentile, max, share truncated) from a
    merged :func:`length_histogram`, without a per-row array.
    """
    n = int(hist.sum())
    if n == 0:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0, "truncated_share": 0.0}
    values = np.arange(len(hist))
    cum = np.cumsum(hist)

    def pct(q: float) -> float:  # numpy's default (linear) percentile over the sorted values
        pos = (n - 1) * q / 100
        lo, hi = int(np.floor(pos)), int(np.ceil(pos))
        a, b = (int(np.searchsorted(cum, k + 1)) for k in (lo, hi))
        return float(a + (b - a) * (pos - lo))

    return {
        "mean": round(float((values * hist).sum() / n), 2),
        "p50": pct(50),
        "p95": pct(95),
        "max": float(values[hist > 0].max()),
        "truncated_share": round(float(hist[max_length + 1 :].sum() / n), 4),
    }
