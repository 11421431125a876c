"""Write tokenized reviews as one MosaicML MDS dataset per split, and read them back to verify.

Samples are written straight from the Arrow buffers (one zero-copy numpy slice per row), not
via per-row Python dict lookups on a Hugging Face dataset; zstd on variable-length uint16
ids is what makes the shards small.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from finetune_assets.data.tokenize import SPLITS

COMPRESSION = "zstd"
# Written beside each split's index.json: what readers need up front without decoding a sample
# (the trainer's class weights and split sizes). StreamingDataset ignores files it does not index.
SPLIT_STATS = "split_stats.json"


def mds_columns(id_dtype: np.dtype) -> dict[str, str]:
    return {"input_ids": f"ndarray:{np.dtype(id_dtype).name}", "label": "int8"}


@dataclass(frozen=True)
class SplitShards:
    split: str
    samples: int
    shards: int
    bytes: int
    label_counts: dict[str, int]  # label id -> samples, as written to split_stats.json


def write_split(table: pa.Table, out_dir: Path, size_limit: int | str = "64mb",
                progress: Callable[[int], None] | None = None) -> SplitShards:
    from streaming import MDSWriter

    ids = table.column("input_ids").combine_chunks()
    flat = ids.values.to_numpy(zero_copy_only=False)
    offsets = ids.offsets.to_numpy()
    labels = table.column("label").to_numpy()
    out_dir.mkdir(parents=True, exist_ok=True)
    with MDSWriter(out=str(out_dir), columns=mds_columns(flat.dtype), compression=COMPRESSION,
                   size_limit=size_limit, progress_bar=False) as writer:
        for i in range(len(labels)):
            writer.write({"input_ids": flat[offsets[i]:offsets[i + 1]], "label": int(labels[i])})
            if progress and (i + 1) % 5000 == 0:
                progress(i + 1)
    stats = write_split_stats(out_dir, labels)
    shards = sorted(out_dir.glob("shard.*.mds*"))
    return SplitShards(split=out_dir.name, samples=len(labels), shards=len(shards),
                       bytes=sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file()),
                       label_counts=stats["label_counts"])


def write_split_stats(out_dir: Path, labels: np.ndarray) -> dict:
    """``split_stats.json``: samples and samples per label id, computed once where the labels are at hand."""
    import json

    ids, counts = np.unique(np.asarray(labels, dtype=np.int64), return_counts=True)
    stats = {"samples": int(len(labels)), "label_counts": {str(int(i)): int(c) for i, c in zip(ids, counts)}}
    (out_dir / SPLIT_STATS).write_text(json.dumps(stats, sort_keys=True))
    return stats


def write_splits(table: pa.Table, out_dir: Path, size_limit: int | str = "64mb",
                 progress: Callable[[str, int], None] | None = None) -> dict[str, SplitShards]:
    results = {}
    split_col = table.column("split").cast(pa.string())
    for split in SPLITS:
        part = table.filter(pc.equal(split_col, split))
        results[split] = write_split(part, out_dir / split, size_limit,
                                     (lambda n, s=split: progress(s, n)) if progress else None)
    return results


def open_streaming_dataset(attempts: int = 8, **kwargs):
    """``StreamingDataset(**kwargs)``, retried when another process grabs the same shared-memory prefix.

    streaming picks the first free prefix and then creates it; two processes opening datasets at the
    same moment (two partitions' shard checks, two local trainings) can pick the same one, and the
    loser fails with ``FileExistsError: '/000NNN_locals'``. Looking again finds the next free prefix.
    """
    import random
    import time

    from streaming import StreamingDataset

    for attempt in range(attempts):
        try:
            return StreamingDataset(**kwargs)
        except FileExistsError:
            if attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0.05, 0.3) * (attempt + 1))
    raise AssertionError("unreachable")


def read_back_count(split_dir: Path) -> int:
    """Samples visible through ``streaming.StreamingDataset`` (the reader the trainer uses).

    Read as the trainer does, with ``split_dir`` as the remote and a throwaway local cache: opening
    compressed shards in place would decompress them beside the originals, into the published data.
    """
    import json
    import tempfile

    index = json.loads((split_dir / "index.json").read_text())
    if not index.get("shards"):  # an empty split (tiny versions): StreamingDataset refuses to open it
        return 0
    with tempfile.TemporaryDirectory(prefix="mds-readback-") as cache:
        ds = open_streaming_dataset(remote=str(split_dir), local=cache, shuffle=False, batch_size=1)
        n = ds.num_samples
        if n:
            first, last = ds[0], ds[n - 1]
            for sample in (first, last):
                if sample["input_ids"].ndim != 1 or "label" not in sample:
                    raise ValueError(f"{split_dir}: sample does not decode to input_ids + label")
        del ds
    return n
