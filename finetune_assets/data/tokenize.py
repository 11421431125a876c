"""Batched fast-tokenizer encoding into unpadded token ids, with a split that never moves.

Padding is the trainer's job (per batch, to the longest sequence), so nothing is stored padded.
Texts are encoded in full and truncated here, which keeps the original length for the
"truncated share" statistic at no extra cost.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from finetune_assets.data.labels import LABEL2ID
from finetune_assets.data.validate import normalize_text

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class SplitRule:
    """Fractions of the hash space; a review's split depends only on its normalized text."""

    validation: float = 0.1
    test: float = 0.1
    salt: str = "finetune_assets/v1"

    def __post_init__(self):
        if not (0 <= self.validation < 1 and 0 <= self.test < 1 and self.validation + self.test < 1):
            raise ValueError("validation and test fractions must be in [0, 1) and sum to less than 1")

    def assign(self, texts: list[str]) -> list[str]:
        out = []
        for t in texts:
            digest = hashlib.blake2b(f"{self.salt}\x00{normalize_text(t)}".encode(), digest_size=8).digest()
            u = int.from_bytes(digest, "big") / 2**64
            out.append("test" if u < self.test else "validation" if u < self.test + self.validation else "train")
        return out


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every token id."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def tokenize_table(
    accepted: pa.Table,
    tokenizer,
    max_length: int,
    split_rule: SplitRule,
    batch_size: int = 2048,
    progress: Callable[[int, int], None] | None = None,
) -> pa.Table:
    """``accepted`` (text, label) -> input_ids (list of uint), length, label (int8), split."""
    if max_length < 2:
        raise ValueError("max_length must be at least 2 (room for [CLS] and [SEP])")
    backend = tokenizer.backend_tokenizer
    backend.no_truncation()
    backend.no_padding()
    sep_id = tokenizer.sep_token_id
    dtype = token_dtype(len(tokenizer))
    texts = accepted.column("text").to_pylist()
    n = len(texts)
    pieces: list[np.ndarray] = []
    full_lengths = np.empty(n, dtype=np.int64)
    for start in range(0, n, batch_size):
        for i, enc in enumerate(backend.encode_batch(texts[start:start + batch_size]), start):
            ids = np.asarray(enc.ids, dtype=dtype)
            full_lengths[i] = len(ids)
            if len(ids) > max_length:  # keep [CLS] + head, end with [SEP], as HF truncation does
                ids = np.concatenate([ids[: max_length - 1], np.asarray([sep_id], dtype=dtype)])
            pieces.append(ids)
        if progress:
            progress(min(start + batch_size, n), n)
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int32, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(pieces) if pieces else np.empty(0, dtype=dtype)
    input_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    labels = np.fromiter((LABEL2ID[x] for x in accepted.column("label").to_pylist()), dtype=np.int8, count=n)
    return pa.table({
        "input_ids": input_ids,
        "length": pa.array(lengths),
        "full_length": pa.array(full_lengths.astype(np.int32)),
        "label": pa.array(labels),
        "split": pa.array(split_rule.assign(texts), pa.string()).dictionary_encode(),
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
