"""Content-addressed tokenization cache under the storage root: shared rows are tokenized once.

Layout under ``{root}/token_cache/{tokenizer hash}-{max_length}/``:

- ``{segment}.arrow`` + ``{segment}.keys``: the rows one slice worker tokenized anew: ``key``
  (16-byte hash of the exact text that was tokenized), ``input_ids`` (already truncated to
  ``max_length``) and ``full_length``; the ``.keys`` file holds the keys alone, 16 bytes each, in
  the segment's row order.
- ``index/{name}.idx`` + ``{name}.json``: every key of the segments the JSON lists, sorted, with the
  segment and row that hold it. The asset merges each version's new segments into it
  (:meth:`TokenCache.compact`, bounded memory: a key range at a time), so a lookup is a binary
  search per row into one file (memory-mapped, only the pages it touches) instead of a scan of every
  segment: a slice's lookup costs O(slice x log cache), not O(cache), and the number of slices no
  longer multiplies the cache's size. Segments no index lists yet (a version still tokenizing, a
  compaction that failed) are searched one by one, as before.

The key is the hash of the text as tokenized, not of the normalized text: two reviews with one
normalized form (same split, same duplicate identity) can still differ in case or invisible
characters, which a cased tokenizer encodes differently. The tokenizer hash is of its full
definition (``tokenizer.json``: vocabulary, normalizer, post-processor), so any change starts a
fresh namespace.

Concurrency: segments and indexes are immutable and named by their content; each file is written
atomically (temp file + rename, or one PUT on object stores), a segment's ``.keys`` only after its
``.arrow`` and an index's ``.json`` only after its ``.idx``, so a reader sees a complete one or
none. Two versions writing at once add distinct segments (or the same bytes under the same name);
two compacting at once each publish an index, and the next compaction merges from the larger one. An
index is deleted only once a published one lists all its segments; a reader that loses that race
looks again. A cache is only ever an accelerator: a segment or index that cannot be read makes rows
misses (tokenized anew), never wrong tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa

from finetune_assets.core.io.primitives import staged_file, write_bytes_atomic
from finetune_assets.core.prep.token_index import (
    INDEX_FORMAT,
    KEY_BYTES,
    MERGE_CHUNK_ROWS,
    IndexFile,
    KeyRun,
    key_halves,
    merge_runs,
    open_index,
    write_run,
)

CACHE_DIR = "token_cache"
INDEX_DIR = "index"


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


class TokenCache:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.path = fsspec.core.url_to_fs(self.url)
        self.local = isinstance(self.fs, fsspec.implementations.local.LocalFileSystem)
        # remote index name -> a local copy (one download per process)
        self._downloads: dict[str, str] = {}
        # where those copies live (removed with self)
        self._scratch: tempfile.TemporaryDirectory | None = None

    def _segments(self) -> list[str]:
        try:
            names = self.fs.ls(self.path, detail=False)
        except FileNotFoundError:
            return []
        return sorted(Path(n).name[: -len(".keys")] for n in names if n.endswith(".keys"))

    def has_segments(self) -> bool:
        return bool(self._segments())

    def _seg_url(self, name: str, suffix: str) -> str:
        return f"{self.path}/{name}{suffix}"

    # -- index -------------------------------------------------------------------------------------
    def _indexes(self) -> list[IndexFile]:
        try:
            names = self.fs.ls(f"{self.path}/{INDEX_DIR}", detail=False)
        except FileNotFoundError:
            return []
        found = []
        for n in sorted(names):
            if not n.endswith(".json") or Path(n).name.startswith("."):
                continue
            try:
                with self.fs.open(n, "r") as f:
                    meta = json.load(f)
            except (FileNotFoundError, ValueError):  # deleted meanwhile by a newer compaction
                continue
            if meta.get("format") == INDEX_FORMAT:
                found.append(
                    IndexFile(Path(n).name[: -len(".json")], meta["segments"], int(meta["rows"]))
                )
        return found

    def _best_index(self, segments: list[str]) -> IndexFile | None:
        present = set(segments)
        # every segment it names exists
        indexes = [i for i in self._indexes() if set(i.segments) <= present]
        return max(indexes, key=lambda i: (i.rows, i.name), default=None)

    def _index_run(self, index: IndexFile) -> KeyRun:
        url = f"{self.path}/{INDEX_DIR}/{index.name}.idx"
        if self.local:
            return open_index(url, index.rows)
        if index.name not in self._downloads:
            if self._scratch is None:
                self._scratch = tempfile.TemporaryDirectory(prefix="token-index-")
            local = f"{self._scratch.name}/{index.name}.idx"
            self.fs.get_file(url, local)
            self._downloads[index.name] = local
        return open_index(self._downloads[index.name], index.rows)

    def _runs(self) -> tuple[list[str], list[KeyRun], list[str]]:
        """(segment names, runs to search in order, segments searched one by one): the largest
        index, then every segment it does not list. An index deleted between listing and opening:
        look again once.
        """
        for attempt in range(2):
            segments = self._segments()
            index = self._best_index(segments)
            try:
                runs = [self._index_run(index)] if index is not None else []
                break
            except FileNotFoundError:
                if attempt:
                    index, runs = None, []
        names = list(index.segments) if index is not None else []
        listed = set(names)
        loose = [s for s in segments if s not in listed]
        return names, runs, loose

    def _segment_run(self, name: str, seg: int) -> KeyRun | None:
        try:
            with self.fs.open(self._seg_url(name, ".keys"), "rb") as f:
                keys = np.frombuffer(f.read(), dtype=np.uint8).reshape(-1, KEY_BYTES)
        except FileNotFoundError:
            return None
        return KeyRun.of_segment(keys, seg)

    # -- lookup ------------------------------------------------------------------------------------
    def lookup(self, keys: np.ndarray, dtype: np.dtype) -> Hits:
        """Rows of ``keys`` already in the cache, with their tokens (each segment read once)."""
        list_type = pa.list_(pa.from_numpy_dtype(dtype))
        empty = Hits(np.empty(0, np.int64), pa.array([], list_type), np.empty(0, np.int32))
        if len(keys) == 0:
            return empty
        hi, lo = key_halves(keys)
        # looked-up row -> segment number (into ``names``)
        seg_of = np.full(len(keys), -1, np.int64)
        row_of = np.zeros(len(keys), np.int64)
        names, runs, loose = self._runs()

        def search(run: KeyRun) -> None:
            todo = np.flatnonzero(seg_of < 0)
            pos = run.find(hi[todo], lo[todo])
            ok = pos >= 0
            seg_of[todo[ok]] = run.seg[pos[ok]]
            row_of[todo[ok]] = run.row[pos[ok]]

        for run in runs:
            search(run)
        for name in loose:
            if (seg_of >= 0).all():
                break
            run = self._segment_run(name, len(names))
            names.append(name)
            if run is not None:
                search(run)
        rows, ids, full = [], [], []
        hit = np.flatnonzero(seg_of >= 0)
        # by segment, then row: each segment read once, in order
        hit = hit[np.lexsort((row_of[hit], seg_of[hit]))]
        segs, starts = np.unique(seg_of[hit], return_index=True)
        for seg, target in zip(segs, np.split(hit, starts[1:])):
            try:
                self._read_rows(names[seg], row_of[target], target, list_type, rows, ids, full)
            except FileNotFoundError:  # a segment gone: its rows are misses, tokenized anew
                continue
        if not rows:
            return empty
        return Hits(
            np.concatenate(rows).astype(np.int64),
            pa.concat_arrays(ids),
            np.concatenate(full).astype(np.int32),
        )

    def _read_rows(
        self,
        name: str,
        seg_rows: np.ndarray,
        target: np.ndarray,
        list_type: pa.DataType,
        rows: list,
        ids: list,
        full: list,
    ) -> None:
        """Rows ``seg_rows`` (ascending) of a segment, for looked-up rows ``target``, one
        decompressed batch at a time.
        """
        got_rows, got_ids, got_full = [], [], []
        with self.fs.open(self._seg_url(name, ".arrow"), "rb") as f:
            reader = pa.ipc.open_file(f)
            start = 0
            for b in range(reader.num_record_batches):
                batch = reader.get_batch(b)
                first, end = np.searchsorted(seg_rows, [start, start + batch.num_rows])
                if end > first:
                    taken = batch.take(pa.array(seg_rows[first:end] - start))
                    got_ids.append(taken.column("input_ids").cast(list_type))
                    got_full.append(taken.column("full_length").to_numpy())
                    got_rows.append(target[first:end])
                start += batch.num_rows
        rows += got_rows  # all of a segment or none of it
        ids += got_ids
        full += got_full

    # -- compaction --------------------------------------------------------------------------------
    def compact(self, chunk_rows: int = MERGE_CHUNK_ROWS) -> dict:
        """Merge the segments no index lists into a new index (with the largest one's entries),
        publish it and drop the indexes it supersedes. Bounded memory: the inputs are sorted runs on
        disk, merged a key range at a time. Safe to run concurrently and to re-run. Returns counts
        for the asset's metadata.
        """
        names, runs, loose = self._runs()
        if not loose:
            return {
                "index_rows": sum(len(r) for r in runs),
                "indexed_segments": len(names),
                "merged_segments": 0,
            }
        indexed = len(names)
        with tempfile.TemporaryDirectory(prefix="token-index-") as tmp:
            for name in loose:  # each new segment as a sorted run on local disk
                run = self._segment_run(name, len(names))
                if run is None:
                    continue
                path = f"{tmp}/{len(names)}.run"
                write_run(path, run)
                runs.append(open_index(path, len(run)))
                names.append(name)
            out = f"{tmp}/index.idx"
            total = merge_runs(runs, out, chunk_rows)
            del runs
            name = hashlib.sha256("\n".join(names).encode()).hexdigest()[:32]
            with staged_file(f"{self.url}/{INDEX_DIR}/{name}.idx") as target:
                shutil.move(out, target)
            write_bytes_atomic(
                f"{self.url}/{INDEX_DIR}/{name}.json",
                json.dumps({"format": INDEX_FORMAT, "rows": total, "segments": names}).encode(),
            )
        listed = set(names)
        for old in self._indexes():  # superseded: every segment it lists is in the new one
            if old.name != name and set(old.segments) <= listed:
                for suffix in (".json", ".idx"):  # the JSON first: no reader picks it any more
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm(f"{self.path}/{INDEX_DIR}/{old.name}{suffix}")
        return {
            "index_rows": total,
            "indexed_segments": len(names),
            "merged_segments": len(names) - indexed,
        }

    def segment(self) -> SegmentWriter:
        """Where a slice's newly tokenized rows go (a context manager: published on clean exit)."""
        return SegmentWriter(self)


class SegmentWriter:
    """One slice's newly tokenized rows, written batch by batch (a worker holds one batch of tokens,
    not the slice's), published as one segment on a clean exit: the tokens, then the keys that make
    them visible.
    """

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
        batch = pa.record_batch(
            {
                "key": pa.FixedSizeBinaryArray.from_buffers(
                    pa.binary(KEY_BYTES), len(ids), [None, pa.py_buffer(keys.tobytes())]
                ),
                "input_ids": ids,
                "full_length": pa.array(np.asarray(full, dtype=np.int32)),
            }
        )
        if self._writer is None:
            self._writer = pa.ipc.new_file(
                self._tmp.name, batch.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")
            )
        self._writer.write_batch(batch)
        self.keys.append(keys.tobytes())

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
            if exc_type is None and self.keys:
                keys = b"".join(self.keys)
                self.name = hashlib.sha256(keys).hexdigest()[:32]
                with staged_file(f"{self.cache.url}/{self.name}.arrow") as tmp:
                    shutil.move(self._tmp.name, tmp)
                with staged_file(f"{self.cache.url}/{self.name}.keys") as tmp:
                    tmp.write_bytes(keys)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp.name)
