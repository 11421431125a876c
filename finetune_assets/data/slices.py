"""Slice workers: tokenization and MDS shard writing over slices of a version, one process (or pod) per slice.

    python -m finetune_assets.data.slices work --spec URL      # the slice index comes from $JOB_COMPLETION_INDEX

The asset plans the slices (:func:`plan_slices`), writes a spec JSON into its staging attempt and fans the
command out (``launchers/fanout.py``: local subprocesses or a Kubernetes Indexed Job). Workers read and
write only through storage URLs (fsspec), one part per slice, a re-run slice overwriting its own part:

- ``tokenize``: row groups ``[start, stop)`` of ``reviews.parquet`` -> ``{out}/parts/{i:05d}.arrow`` (token
  ids, lengths, label id, split) + ``{i:05d}.json`` (counts, token-length histogram, cache reuse).
- ``shards``: token parts ``[start, stop)`` -> one MDS sub-dataset per part and split, ``{out}/{split}/{part:05d}/``
  (a worker takes several parts: streaming's import costs seconds), then the asset
  joins them with streaming's ``merge_index`` into ``{out}/{split}/index.json`` (as llm-foundry's converters do).

**Order.** Slices are contiguous ranges of ``reviews.parquet`` row groups and each worker keeps row
order, so part ``i`` precedes part ``i + 1`` and a split's samples are in ``reviews.parquet`` row order
whatever the number of slices or workers: the same samples in the same order (shard boundaries differ).

**Memory.** A worker holds one slice's keys and cached tokens plus one batch, bounded by ``slice_rows``
and ``batch_size``, not by the version's size; the token cache's index is searched memory-mapped (page
cache, only the pages its binary searches touch), never loaded. One process per core: the fast
tokenizer's own thread pool is switched off (``TOKENIZERS_PARALLELISM=false``), parallelism comes from
the workers.
Dagster-free (test_layers.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from finetune_assets.contracts import SPLITS, TOKEN_PARTS_DIR
from finetune_assets.data.labels import LabelSet
from finetune_assets.data.tokenize import encode_texts, label_ids, length_histogram, token_batch
from finetune_assets.data.validate import split_column

INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by the fan-out runner, as a Kubernetes Indexed Job sets it
PARTS = TOKEN_PARTS_DIR
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
# EX_TEMPFAIL (sysexits.h): a transient I/O error (object store 503, reset, timeout); the Kubernetes
# fan-out retries the index for it (launchers/k8s/failures.py) instead of failing it as a code error.
TRANSIENT_EXIT_CODE = 75


def part_name(index: int) -> str:
    return f"{index:05d}"


@dataclass(frozen=True)
class TokenizeSpec:
    reviews: str  # URL of raw_reviews' reviews.parquet
    out: str  # staging URL of the tokenized_reviews attempt
    slices: list[list[int]]  # row-group ranges [start, stop) of reviews.parquet, one per index
    tokenizer: str  # URL of a tokenizer.json (no truncation, no padding)
    dtype: str  # token id dtype, e.g. "uint16"
    max_length: int
    labels: dict  # LabelSet.to_dict() of the version
    batch_size: int = 2048
    cache: str | None = (
        None  # TokenCache URL ({root}/token_cache/{tokenizer hash}-{max_length}) or None
    )
    stage: str = "tokenize"
    groups: list[list[int]] | None = (
        None  # per index: the slices [start, stop) it tokenizes; None: one each
    )

    @property
    def count(self) -> int:
        return len(self.groups) if self.groups is not None else len(self.slices)

    def slices_of(self, index: int) -> range:
        return range(*self.groups[index]) if self.groups is not None else range(index, index + 1)


@dataclass(frozen=True)
class ShardsSpec:
    tokens: str  # URL of the tokenized_reviews attempt (its parts/)
    out: str  # staging URL of the mds_shards attempt
    groups: list[
        list[int]
    ]  # per index: the token parts [start, stop) it writes, one sub-dataset per part
    size_limit: str | int = "64mb"
    stage: str = "shards"

    @property
    def count(self) -> int:
        return len(self.groups)


# a shard worker pays streaming's import (~1.6 s, ~50 µs a sample): worth it from ~64k rows
SHARD_ROWS_PER_WORKER = 32_000


def group_parts(parts: int, workers: int, rows: int | None = None) -> list[list[int]]:
    """Contiguous ranges of parts (slices), one per worker: a worker pays its imports once, however many parts
    it takes. Shard workers pass ``rows``: streaming's import is worth a second worker only from
    :data:`SHARD_ROWS_PER_WORKER` rows each. Parts are about equal in rows (:func:`plan_slices`).
    """
    useful = workers if rows is None else max(1, rows // SHARD_ROWS_PER_WORKER)
    count = max(1, min(parts, workers, useful))
    cuts = [round(k * parts / count) for k in range(count + 1)]
    return [[a, b] for a, b in zip(cuts, cuts[1:])]


def plan_slices(row_group_rows: list[int], workers: int, slice_rows: int) -> list[list[int]]:
    """Contiguous row-group ranges of about equal rows: at least ``workers`` (all cores busy), at most
    ``slice_rows`` rows each where row groups allow (a worker's memory), never more than the row groups.

    The count is a multiple of ``workers`` where row groups allow, so no worker idles through a last
    round (5 slices on 2 workers would leave one core idle for a fifth of the step).
    """
    groups = len(row_group_rows)
    if groups == 0:
        return []
    total = int(sum(row_group_rows))
    workers = max(1, workers)
    wanted = max(workers, math.ceil(total / max(1, slice_rows)))
    count = min(groups, math.ceil(wanted / workers) * workers)
    cum = np.concatenate([[0], np.cumsum(row_group_rows)])  # cum[i]: rows before row group i
    cuts = [0]
    for k in range(1, count):
        target = total * k / count
        i = int(
            np.searchsorted(cum, target)
        )  # cum[i - 1] < target <= cum[i]: cut at the nearer boundary
        if i > 0 and target - cum[i - 1] < cum[min(i, groups)] - target:
            i -= 1
        cuts.append(min(max(i, cuts[-1] + 1), groups - (count - k)))
    cuts.append(groups)
    return [[a, b] for a, b in zip(cuts, cuts[1:])]


def write_spec(url: str, spec: TokenizeSpec | ShardsSpec) -> None:
    from finetune_assets.storage import write_bytes_atomic

    write_bytes_atomic(url, json.dumps(asdict(spec), ensure_ascii=False).encode())


def read_spec(url: str) -> TokenizeSpec | ShardsSpec:
    with fsspec.open(url, "r", encoding="utf-8") as f:
        data = json.load(f)
    return {"tokenize": TokenizeSpec, "shards": ShardsSpec}[data["stage"]](**data)


def read_part_stats(out: str, count: int) -> list[dict]:
    """Every part's stats JSON, in part order; a missing one names the slice."""
    stats = []
    for i in range(count):
        url = f"{out}/{PARTS}/{part_name(i)}.json"
        try:
            with fsspec.open(url, "r") as f:
                stats.append(json.load(f))
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"slice {i}: its worker reported success but wrote no {url}"
            ) from err
    return stats


# -- output helpers: a part appears whole or not at all --------------------------------------------------
@contextlib.contextmanager
def writing(url: str):
    """A local path to write ``url``'s content to; on success it replaces ``url`` in one step.

    Local: a hidden temp file in the target folder (same filesystem), then ``os.replace``. Remote: a temp
    file, then one upload (atomic on object stores). On failure nothing appears at ``url``.
    """
    fs, path = fsspec.core.url_to_fs(url)
    local = isinstance(fs, fsspec.implementations.local.LocalFileSystem)
    folder = Path(path).parent if local else Path(tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=str(folder), prefix=f".{Path(path).name}.")
    os.close(fd)
    try:
        yield Path(tmp)
        if local:
            os.replace(tmp, path)
        else:
            fs.put_file(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _put_json(url: str, data: dict) -> None:
    from finetune_assets.storage import write_bytes_atomic

    write_bytes_atomic(url, json.dumps(data, sort_keys=True).encode())


# -- tokenize ------------------------------------------------------------------------------------------------
def tokenize_group(spec: TokenizeSpec, index: int, log=print) -> list[dict]:
    """Index ``index`` of a tokenize fan-out: its slices one after the other, each its own part (a worker
    pays its imports once, however many slices it takes; a slice bounds its memory).
    """
    from finetune_assets.data.token_cache import TokenCache

    cache = (
        TokenCache(spec.cache) if spec.cache else None
    )  # one per worker: a remote index is downloaded once
    return [tokenize_slice(spec, i, log, cache) for i in spec.slices_of(index)]


def tokenize_slice(spec: TokenizeSpec, index: int, log=print, cache=None) -> dict:
    import tokenizers

    from finetune_assets.data.token_cache import TokenCache, text_keys

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
        # A cache with no segment yet (a first version) is not looked up: no first pass over the texts.
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
        # rows tokenized anew go to the cache batch by batch, published as one segment when the slice is done
        with (
            writing(f"{spec.out}/{PARTS}/{part_name(index)}.arrow") as local,
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
        f"slice {index}: {row} rows tokenized ({stats['reused']} from the cache) in {stats['seconds']} s"
    )
    return stats


# -- shards ------------------------------------------------------------------------------------------------------
def shard_slice(spec: ShardsSpec, index: int, log=print) -> list[dict]:
    """Index ``index`` of a shards fan-out: each of its token parts becomes its own MDS sub-dataset."""
    return [shard_part(spec, part, log) for part in range(*spec.groups[index])]


def shard_part(spec: ShardsSpec, index: int, log=print) -> dict:
    from finetune_assets.data.shards import COMPRESSION, mds_columns, streaming_module

    MDSWriter = streaming_module("streaming.base.format.mds.writer").MDSWriter

    t0 = time.perf_counter()
    name = part_name(index)
    fs, out_path = fsspec.core.url_to_fs(spec.out)
    local_root = isinstance(fs, fsspec.implementations.local.LocalFileSystem)
    tmp = None if local_root else tempfile.mkdtemp(prefix="mds-part-")
    base = Path(out_path) if local_root else Path(tmp)
    stats: dict = {}
    try:
        with fsspec.open(f"{spec.tokens}/{PARTS}/{name}.arrow", "rb") as f:
            reader = pa.ipc.open_file(f)
            id_type = reader.schema.field("input_ids").type.value_type.to_pandas_dtype()
            writers = {}
            for split in SPLITS:
                d = base / split / name
                shutil.rmtree(d, ignore_errors=True)  # a re-run slice replaces its own part
                d.mkdir(parents=True)
                writers[split] = MDSWriter(
                    out=str(d),
                    columns=mds_columns(np.dtype(id_type)),
                    compression=COMPRESSION,
                    size_limit=spec.size_limit,
                    progress_bar=False,
                )
            counts = {s: {} for s in SPLITS}
            samples = dict.fromkeys(SPLITS, 0)
            for b in range(reader.num_record_batches):
                batch = reader.get_batch(b)
                ids = batch.column("input_ids")
                flat = ids.values.to_numpy(zero_copy_only=False)
                offsets = ids.offsets.to_numpy()
                labels = batch.column("label").to_numpy()
                split_col = batch.column("split")
                codes = split_col.indices.to_numpy(zero_copy_only=False)
                names = split_col.dictionary.to_pylist()
                for i in range(len(labels)):
                    split = names[codes[i]]
                    label = int(labels[i])
                    writers[split].write(
                        {"input_ids": flat[offsets[i] : offsets[i + 1]], "label": label}
                    )
                    samples[split] += 1
                    counts[split][str(label)] = counts[split].get(str(label), 0) + 1
            for w in writers.values():
                w.finish()
        for split in SPLITS:
            d = base / split / name
            files = [p for p in d.iterdir() if p.is_file()]
            stats[split] = {
                "samples": samples[split],
                "label_counts": counts[split],
                "shards": sum(1 for p in files if p.name.startswith("shard.")),
                "bytes": sum(p.stat().st_size for p in files),
            }
            if tmp is not None:
                fs.put(str(d) + "/", f"{out_path}/{split}/{name}/", recursive=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    _put_json(f"{spec.out}/{PARTS}/{name}.json", stats)
    log(f"part {index}: {sum(samples.values())} samples written in {stats['seconds']} s")
    return stats


class _MergeNotices(logging.Filter):
    """merge_index's two notices per split (its temp folder; the output folder exists, which it must)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("A temporary folder") or "exists and not empty" in message)


@contextlib.contextmanager
def _quiet_merge_notices():
    """Drop only those notices, only during the merge, on the two loggers streaming emits them on."""
    loggers = [logging.getLogger(), logging.getLogger("streaming.base.storage.upload")]
    drop = _MergeNotices()
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


def merge_shards(out: str, local_dir: Path, count: int) -> dict[str, dict]:
    """Join the slices' MDS sub-datasets into one dataset per split with ``streaming.base.util.merge_index``.

    The merged ``{split}/index.json`` (and ``split_stats.json``) is written into ``local_dir`` (the publish
    staging folder); shard basenames become ``{i:05d}/shard...``, in slice order. Returns per split:
    samples, shards, bytes, label_counts (summed from the parts' stats).
    """
    from finetune_assets.data.shards import streaming_module

    merge_index = streaming_module("streaming.base.util").merge_index
    from finetune_assets.contracts import SPLIT_STATS_FILE, SplitStats

    fs, out_path = fsspec.core.url_to_fs(out)
    parts = read_part_stats(out, count)
    result = {}
    for split in SPLITS:
        indexes = []
        for i in range(count):
            local_index = local_dir / split / part_name(i) / "index.json"
            if not local_index.exists():  # object-store root: the worker wrote it remotely
                local_index.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(f"{out_path}/{split}/{part_name(i)}/index.json", str(local_index))
            indexes.append(str(local_index))
        with _quiet_merge_notices():
            merge_index(indexes, str(local_dir / split), keep_local=True)
        label_counts: dict[str, int] = {}
        for p in parts:
            for k, v in p[split]["label_counts"].items():
                label_counts[k] = label_counts.get(k, 0) + v
        samples = sum(p[split]["samples"] for p in parts)
        stats = SplitStats(
            samples=samples, label_counts={int(k): v for k, v in label_counts.items()}
        )
        (local_dir / split / SPLIT_STATS_FILE).write_text(stats.to_json())
        result[split] = {
            "samples": samples,
            "label_counts": dict(sorted(label_counts.items())),
            "shards": sum(p[split]["shards"] for p in parts),
            "bytes": sum(p[split]["bytes"] for p in parts),
        }
    return result


# -- reading token parts -------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune_assets.data.slices")
    sub = parser.add_subparsers(dest="command", required=True)
    work = sub.add_parser("work", help=f"run slice ${INDEX_ENV} of the spec")
    work.add_argument("--spec", required=True, help="URL of the spec JSON the asset wrote")
    work.add_argument(
        "--index", type=int, default=None, help=f"slice index (default: ${INDEX_ENV})"
    )
    args = parser.parse_args(argv)
    index = args.index if args.index is not None else os.environ.get(INDEX_ENV)
    if index is None:
        parser.error(f"no slice index: set ${INDEX_ENV} (the fan-out runner does) or pass --index")
    spec = read_spec(args.spec)
    index = int(index)
    count = spec.count
    if not 0 <= index < count:
        parser.error(f"slice index {index} is outside 0..{count - 1} of {args.spec}")
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    try:
        (tokenize_group if isinstance(spec, TokenizeSpec) else shard_slice)(spec, index, log)
    except (ConnectionError, TimeoutError) as e:  # the store's hiccup, not this slice's fault
        print(
            f"slice {index}: transient I/O error, exit {TRANSIENT_EXIT_CODE} for a retry: {e!r}",
            file=sys.stderr,
            flush=True,
        )
        return TRANSIENT_EXIT_CODE
    return 0


if __name__ == "__main__":
    os.environ.update({k: v for k, v in WORKER_ENV.items() if k not in os.environ})
    sys.exit(main())
