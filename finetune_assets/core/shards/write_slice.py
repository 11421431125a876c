"""The shard slice worker (token parts -> one MDS sub-dataset per part and split) and the merge of
the parts' indexes into one dataset per split. Dagster-free (test_layers.py).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa

from finetune_assets.core.io.contracts import SPLIT_STATS_FILE, SPLITS, SplitStats, mds_columns
from finetune_assets.core.shards.mds import COMPRESSION, streaming_module
from finetune_assets.core.shards.plan import (
    PARTS,
    ShardsSpec,
    _put_json,
    part_name,
    read_part_stats,
)


def shard_slice(spec: ShardsSpec, index: int, log=print) -> list[dict]:
    """Index ``index`` of a shards fan-out: each of its token parts becomes its own MDS
    sub-dataset.
    """
    return [shard_part(spec, part, log) for part in range(*spec.groups[index])]


def shard_part(spec: ShardsSpec, index: int, log=print) -> dict:
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
    """merge_index's two notices per split (its temp folder; the output folder exists, which it
    must).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("A temporary folder") or "exists and not empty" in message)


@contextlib.contextmanager
def _quiet_merge_notices():
    """Drop only those notices, only during the merge, on the two loggers streaming emits them
    on.
    """
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
    """Join the slices' MDS sub-datasets into one dataset per split with
    ``streaming.base.util.merge_index``.

    The merged ``{split}/index.json`` (and ``split_stats.json``) is written into ``local_dir`` (the
    publish staging folder); shard basenames become ``{i:05d}/shard...``, in slice order. Returns
    per split: samples, shards, bytes, label_counts (summed from the parts' stats).
    """
    merge_index = streaming_module("streaming.base.util").merge_index
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
