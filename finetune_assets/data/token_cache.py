"""Content-addressed tokenization cache under the storage root: rows shared between versions are tokenized once.

Layout: ``{root}/token_cache/{tokenizer hash}-{max_length}/{segment}.arrow`` + ``{segment}.keys``. A
segment holds the rows one slice worker tokenized anew: ``key`` (16-byte hash of the exact text that was
tokenized), ``input_ids`` (already truncated to ``max_length``) and ``full_length``. The ``.keys`` file
(the keys alone, 16 bytes each) is what lookups scan, so a lookup never decompresses tokens it does not use.

The key is the hash of the text as tokenized, not of the normalized text: two reviews with one
normalized form (same split, same duplicate identity) can still differ in case or invisible
characters, which a cased tokenizer encodes differently. The tokenizer hash is of its full definition
(``tokenizer.json``: vocabulary, normalizer, post-processor), so any change starts a fresh namespace.

Concurrency: segments are immutable and named by their content; each file is written atomically
(temp file + rename, or one PUT on object stores) and the ``.keys`` file only after its ``.arrow``, so
a reader sees a complete segment or none. Two versions writing at once add distinct segments (or the
same bytes under the same name); rows present in two segments are found once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass

import fsspec
import numpy as np
import pyarrow as pa

KEY_BYTES = 16
CACHE_DIR = "token_cache"


def text_keys(texts: list[str]) -> np.ndarray:
    """(n, 16) uint8: the cache key of each text."""
    digests = b"".join(hashlib.blake2b(t.encode(), digest_size=KEY_BYTES).digest() for t in texts)
    return np.frombuffer(digests, dtype=np.uint8).reshape(len(texts), KEY_BYTES).copy()


def tokenizer_hash(tokenizer_json: str) -> str:
    return hashlib.sha256(tokenizer_json.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Hits:
    """Cached rows of a lookup: ``ids[j]``/``full[j]`` belong to the looked-up row ``rows[j]``."""

    rows: np.ndarray
    ids: pa.ListArray  # compact: one buffer of token ids for all hits
    full: np.ndarray


def _halves(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k = np.ascontiguousarray(keys).view("<u8").reshape(-1, 2)
    return k[:, 0], k[:, 1]


class TokenCache:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.path = fsspec.core.url_to_fs(self.url)

    def _segments(self) -> list[str]:
        try:
            names = self.fs.ls(self.path, detail=False)
        except FileNotFoundError:
            return []
        return sorted(n[: -len(".keys")] for n in names if n.endswith(".keys"))

    def has_segments(self) -> bool:
        return bool(self._segments())

    def lookup(self, keys: np.ndarray, dtype: np.dtype) -> Hits:
        """Rows of ``keys`` already in the cache, with their tokens (each segment read at most once)."""
        if len(keys) == 0:
            return Hits(np.empty(0, np.int64), pa.array([], pa.list_(pa.from_numpy_dtype(dtype))), np.empty(0, np.int32))
        hi, lo = _halves(keys)
        order = np.argsort(hi, kind="stable")
        hi_sorted = hi[order]
        found = np.zeros(len(keys), dtype=bool)
        rows, ids, full = [], [], []
        for seg in self._segments():
            if found.all():
                break
            with self.fs.open(seg + ".keys", "rb") as f:
                seg_hi, seg_lo = _halves(np.frombuffer(f.read(), dtype=np.uint8).reshape(-1, KEY_BYTES))
            pos = np.minimum(np.searchsorted(hi_sorted, seg_hi), len(hi_sorted) - 1)
            cand = order[pos]
            match = (hi[cand] == seg_hi) & (lo[cand] == seg_lo) & ~found[cand]
            if not match.any():
                continue
            seg_rows = np.flatnonzero(match)
            target = cand[match]
            _, first = np.unique(target, return_index=True)  # a key twice in one segment: take it once
            seg_rows, target = seg_rows[first], target[first]
            order_in_seg = np.argsort(seg_rows, kind="stable")
            seg_rows, target = seg_rows[order_in_seg], target[order_in_seg]
            with self.fs.open(seg + ".arrow", "rb") as f:
                reader = pa.ipc.open_file(f)
                start = 0
                for b in range(reader.num_record_batches):  # one decompressed batch at a time
                    batch = reader.get_batch(b)
                    first_row, end_row = np.searchsorted(seg_rows, [start, start + batch.num_rows])
                    if end_row > first_row:
                        taken = batch.take(pa.array(seg_rows[first_row:end_row] - start))
                        ids.append(taken.column("input_ids").cast(pa.list_(pa.from_numpy_dtype(dtype))))
                        full.append(taken.column("full_length").to_numpy())
                        rows.append(target[first_row:end_row])
                    start += batch.num_rows
            found[target] = True
        if not rows:
            return Hits(np.empty(0, np.int64), pa.array([], pa.list_(pa.from_numpy_dtype(dtype))), np.empty(0, np.int32))
        return Hits(np.concatenate(rows).astype(np.int64), pa.concat_arrays(ids), np.concatenate(full).astype(np.int32))

    def segment(self) -> "SegmentWriter":
        """Where a slice's newly tokenized rows go (a context manager: published on a clean exit)."""
        return SegmentWriter(self)


class SegmentWriter:
    """One slice's newly tokenized rows, written batch by batch (a worker holds one batch of tokens, not the
    slice's), published as one segment on a clean exit: the tokens, then the keys that make them visible."""

    def __init__(self, cache: TokenCache):
        self.cache = cache
        self.keys: list[bytes] = []  # 16 bytes a row: a slice's keys stay small
        self.name: str | None = None
        self._tmp = tempfile.NamedTemporaryFile(prefix=".segment-", suffix=".arrow", delete=False)
        self._tmp.close()
        self._writer = None

    def write(self, keys: np.ndarray, ids: pa.ListArray, full: np.ndarray) -> None:
        if len(ids) == 0:
            return
        keys = np.ascontiguousarray(keys, dtype=np.uint8)
        batch = pa.record_batch({
            "key": pa.FixedSizeBinaryArray.from_buffers(pa.binary(KEY_BYTES), len(ids),
                                                        [None, pa.py_buffer(keys.tobytes())]),
            "input_ids": ids,
            "full_length": pa.array(np.asarray(full, dtype=np.int32)),
        })
        if self._writer is None:
            self._writer = pa.ipc.new_file(self._tmp.name, batch.schema,
                                           options=pa.ipc.IpcWriteOptions(compression="zstd"))
        self._writer.write_batch(batch)
        self.keys.append(keys.tobytes())

    def __enter__(self) -> "SegmentWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        from finetune_assets.data.slices import writing

        try:
            if self._writer is not None:
                self._writer.close()
            if exc_type is None and self.keys:
                keys = b"".join(self.keys)
                self.name = hashlib.sha256(keys).hexdigest()[:32]
                with writing(f"{self.cache.url}/{self.name}.arrow") as tmp:
                    shutil.move(self._tmp.name, tmp)
                with writing(f"{self.cache.url}/{self.name}.keys") as tmp:
                    tmp.write_bytes(keys)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp.name)
