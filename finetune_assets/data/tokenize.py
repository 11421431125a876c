"""Batched fast-tokenizer encoding into unpadded token ids; the split comes with the rows from raw_reviews.

Padding is the trainer's job (per batch, to the longest sequence), so nothing is stored padded.
Texts are encoded in full and truncated here, which keeps the original length for the
"truncated share" statistic at no extra cost.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from finetune_assets.data.labels import DEFAULT_LABEL_SET, LabelSet
from finetune_assets.data.validate import split_column


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every token id."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def truncate_keeping_specials(ids: np.ndarray, special_mask: list[int], max_length: int) -> np.ndarray:
    """Cut the text, not the model's own special tokens: leading specials (``[CLS]``, ``<s>``) + as much
    text as fits + trailing specials (``[SEP]``, ``</s>``), whatever the tokenizer's post-processor added."""
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
        raise ValueError(f"max_length {max_length} leaves no room for text beside {head + tail} special tokens")
    return np.concatenate([ids[: head + keep], ids[len(ids) - tail:]]) if tail else ids[: head + keep]


def tokenize_table(
    accepted: pa.Table,
    tokenizer,
    max_length: int,
    batch_size: int = 2048,
    progress: Callable[[int, int], None] | None = None,
    labels: LabelSet = DEFAULT_LABEL_SET,
) -> pa.Table:
    """``accepted`` (text, label, split) -> input_ids (list of uint), length, label (int8 id in ``labels``), split."""
    if max_length < 2:
        raise ValueError("max_length must be at least 2 (room for [CLS] and [SEP])")
    backend = tokenizer.backend_tokenizer
    backend.no_truncation()
    backend.no_padding()
    dtype = token_dtype(len(tokenizer))
    texts = accepted.column("text").to_pylist()
    n = len(texts)
    pieces: list[np.ndarray] = []
    full_lengths = np.empty(n, dtype=np.int64)
    for start in range(0, n, batch_size):
        for i, enc in enumerate(backend.encode_batch(texts[start:start + batch_size]), start):
            ids = np.asarray(enc.ids, dtype=dtype)
            full_lengths[i] = len(ids)
            pieces.append(truncate_keeping_specials(ids, enc.special_tokens_mask, max_length))
        if progress:
            progress(min(start + batch_size, n), n)
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int32, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(pieces) if pieces else np.empty(0, dtype=dtype)
    input_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    label2id = labels.label2id
    names = accepted.column("label").to_pylist()
    unknown = sorted({x for x in names if x not in label2id}, key=str)
    if unknown:
        raise ValueError(f"labels {unknown[:10]} are not classes of the version's label set {list(labels.names)}")
    label_ids = np.fromiter((label2id[x] for x in names), dtype=np.int8, count=n)
    return pa.table({
        "input_ids": input_ids,
        "length": pa.array(lengths),
        "full_length": pa.array(full_lengths.astype(np.int32)),
        "label": pa.array(label_ids),
        "split": split_column(accepted),
    })


def length_stats(table: pa.Table, max_length: int) -> dict[str, float]:
    full = table.column("full_length").to_numpy()
    if len(full) == 0:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0, "truncated_share": 0.0}
    return {
        "mean": round(float(full.mean()), 2),
        "p50": float(np.percentile(full, 50)),
        "p95": float(np.percentile(full, 95)),
        "max": float(full.max()),
        "truncated_share": round(float((full > max_length).mean()), 4),
    }
