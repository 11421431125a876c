"""The MosaicML MDS side shared by the shard workers, ``mds_shards`` and the trainer: the shards'
compression, a lean import of ``streaming``'s modules, a split's numbers, opening a
``StreamingDataset``, releasing its shared memory, and reading a split back to verify it.

The shards themselves are written by the shard slice workers
(:mod:`finetune_assets.core.shards.write_slice`) and merged into one dataset per split.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

COMPRESSION = "zstd"  # on variable-length uint16 ids, what makes the shards small


def streaming_module(name: str):
    """``importlib.import_module(name)`` for a ``streaming.base`` module, without running the
    package ``__init__``s.

    ``streaming/__init__`` eagerly imports its text, vision and multimodal datasets, which load
    transformers and scikit-learn: 5.6 s and ~1 GB per process, measured here, against 1.6 s and
    ~0.5 GB for what the MDS writer, ``merge_index`` and ``StreamingDataset`` need. Every shard
    worker and the shard step pay it, so the two packages are registered bare just for this import
    and removed after it: the loaded modules stay (the same objects a later plain ``import
    streaming`` finds), no bare package is left behind.
    """
    import importlib
    import importlib.util
    import sys

    bare = []
    for package in ("streaming", "streaming.base"):
        if package not in sys.modules:
            sys.modules[package] = importlib.util.module_from_spec(
                importlib.util.find_spec(package)
            )
            bare.append(package)
    try:
        # first, as streaming.base does: util <-> format is circular
        importlib.import_module("streaming.base.format")
        return importlib.import_module(name)
    finally:
        for package in bare:
            del sys.modules[package]


@dataclass(frozen=True)
class SplitShards:
    """One split of ``mds_shards``: what the asset reports, summed from the workers' parts."""

    split: str
    samples: int
    shards: int
    bytes: int
    label_counts: dict[str, int]  # label id -> samples, as written to split_stats.json


def open_streaming_dataset(attempts: int = 8, **kwargs):
    """``StreamingDataset(**kwargs)``, retried when another process on this host grabs the same
    shared-memory prefix.

    streaming registers a prefix per node: every rank scans for the first free one, the local leader
    creates it, the other local ranks check it, with process-group barriers between the steps (and
    one more at the end). Two processes on one host opening datasets at once (two trainings, or two
    "nodes" on one machine) scan the same free prefix: the loser's leader fails with
    ``FileExistsError`` between two barriers, its local ranks with "does not match". A plain retry
    would leave the group's barrier counts unequal and hang it. So a failed rank first completes the
    barriers it skipped; then all ranks agree which *nodes* failed; only those open again (a node
    that succeeded keeps its dataset, which holds its prefix, and just joins the three barriers),
    and they scan after the winner's prefix exists, so the next attempt finds a free one.
    """
    import random
    import time

    import torch
    import torch.distributed as dist

    StreamingDataset = streaming_module("streaming.base.dataset").StreamingDataset

    group = dist.is_available() and dist.is_initialized()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    dataset = None
    for attempt in range(attempts):
        failed = False
        # this node already has its dataset: join the barriers of a retrying node
        if dataset is not None:
            for _ in range(3):
                dist.barrier()
        else:
            try:
                dataset = _new_dataset(StreamingDataset, kwargs)
            except FileExistsError:  # a local leader, after the first barrier
                failed = True
                for _ in range(2 if group else 0):
                    dist.barrier()
            except RuntimeError as err:  # another local rank, after the second barrier
                if "shared memory" not in str(err):
                    raise
                failed = True
                if group:
                    dist.barrier()
        if not group:
            if not failed:
                return dataset
        else:
            device = (
                torch.device("cuda", torch.cuda.current_device())
                if dist.get_backend() == "nccl"
                else None
            )
            flags = torch.zeros(dist.get_world_size(), dtype=torch.int32, device=device)
            flags[dist.get_rank()] = int(failed)
            dist.all_reduce(flags)
            nodes = flags.view(-1, local_world).amax(dim=1).cpu()
            if not nodes.any():
                return dataset
            if nodes[dist.get_rank() // local_world]:
                dataset = (
                    None  # the whole node opens again (a kept dataset still holds its old prefix)
                )
        if attempt == attempts - 1:
            raise FileExistsError(
                f"no free streaming shared-memory prefix after {attempts} attempts"
            )
        time.sleep(random.uniform(0.05, 0.3) * (attempt + 1))
    raise AssertionError("unreachable")


def release_streaming_dataset(dataset) -> int:
    """Close the shared memory a ``StreamingDataset`` holds (and unlink what this process created);
    the dataset is unusable afterwards. Returns how many blocks were released.

    streaming frees its blocks only at interpreter exit: each one registers an ``atexit`` handler,
    which keeps it, its file descriptor and its ``/dev/shm`` file alive. A process that opens
    datasets and lives on (a Dagster step running in-process, a code server, a test session, a
    tuning worker) gains six descriptors and six ``/dev/shm`` blocks per dataset, until it runs out
    of descriptors. A block still viewed by a live numpy array cannot close; it is left to the exit
    handler, as before.

    Blocks the dataset no longer references are found by its prefix: every epoch
    ``load_state_dict`` replaces the resume block and ``__iter__`` attaches to it once more, each a
    descriptor kept to the end (mosaicml/streaming#457); one pass over the garbage collector's
    objects (~60 ms with torch and Dagster loaded). The prefix's ``locals`` block goes last and only
    when every other one went: streaming takes the first prefix whose blocks are all gone, so a
    prefix without ``locals`` but with a leftover block makes the next dataset collide with a live
    one (``FileExistsError``).
    """
    SharedMemory = streaming_module("streaming.base.shared.memory").SharedMemory
    blocks: dict[int, object] = {}

    def collect(obj, depth: int) -> None:
        if isinstance(obj, SharedMemory):
            blocks.setdefault(id(obj), obj)
        elif depth and hasattr(obj, "__dict__"):
            for value in vars(obj).values():
                collect(value, depth - 1)

    # the blocks sit on the dataset (prefix, resume state) or one or two objects down
    # (SharedArray.shm, SharedScalar.arr.shm, SharedBarrier._arr.shm)
    collect(dataset, 3)
    prefix = getattr(dataset, "_shm_prefix_int", None)
    if prefix is not None:
        mine = f"{prefix:06}_"  # streaming's block names: f"{prefix:06}_{what}"
        for block in _live_blocks(SharedMemory).values():
            if _block_name(block).startswith(mine):
                blocks.setdefault(id(block), block)
    # the locals block last (sorted: False before True), and only if nothing else stayed
    ordered = sorted(blocks.values(), key=lambda b: _block_name(b).endswith("_locals"))
    released, created, kept = 0, False, False
    for block in ordered:
        if kept and _block_name(block).endswith("_locals"):
            continue
        created |= bool(block.created_shms)
        if _close(block):
            released += 1
        else:
            kept = True
    if created and not kept:
        # the node's leader also removes the prefix's lock files: streaming skips, for good, every
        # prefix whose lock files exist in the temp dir, so they pile up there and the scan grows
        for path in (
            getattr(getattr(dataset, "_shared_barrier", None), "filelock_path", None),
            getattr(dataset, "_cache_filelock_path", None),
        ):
            if path:
                Path(path).unlink(missing_ok=True)
    return released


def _new_dataset(cls, kwargs: dict):
    """``cls(**kwargs)``, closing what streaming's prefix scan attached to on the way.

    To find a free prefix, streaming attaches to every block of every prefix it walks past (those
    of live datasets on the host: this process's, other trainings') and never closes them, so each
    open kept six descriptors per live dataset to the exit. Only blocks this call attached to, of
    another prefix than the new dataset's, are closed; none is unlinked.
    """
    SharedMemory = streaming_module("streaming.base.shared.memory").SharedMemory
    before = _live_blocks(SharedMemory)  # held, so no id is reused meanwhile
    dataset = None
    try:
        dataset = cls(**kwargs)
        return dataset
    finally:
        mine = f"{dataset._shm_prefix_int:06}_" if dataset is not None else None
        for key, block in _live_blocks(SharedMemory).items():
            if key in before or block.created_shms:
                continue
            if mine is None or not _block_name(block).startswith(mine):
                _close(block)
        del before


def _live_blocks(shared_memory_type) -> dict[int, object]:
    """streaming's ``SharedMemory`` objects alive in this process (one pass over the collector's
    objects: ~60 ms with torch and Dagster loaded).
    """
    import gc

    return {id(o): o for o in gc.get_objects() if isinstance(o, shared_memory_type)}


def _close(block) -> bool:
    """Close (unlink, if it created it) one streaming block now instead of at exit."""
    import atexit

    try:
        block.cleanup()
    except BufferError:  # a live numpy view: the exit handler closes it
        return False
    atexit.unregister(block.cleanup)
    return True


def _block_name(block) -> str:
    return getattr(getattr(block, "shm", None), "name", "") or ""


def read_back_count(split_dir: Path) -> int:
    """Samples visible through ``streaming.StreamingDataset`` (the reader the trainer uses).

    Read as the trainer does, with ``split_dir`` as the remote and a throwaway local cache: opening
    compressed shards in place would decompress them beside the originals, into the published data.
    """
    import json
    import tempfile

    index = json.loads((split_dir / "index.json").read_text())
    # an empty split (tiny versions): StreamingDataset refuses to open it
    if not index.get("shards"):
        return 0
    with tempfile.TemporaryDirectory(prefix="mds-readback-") as cache:
        ds = open_streaming_dataset(remote=str(split_dir), local=cache, shuffle=False, batch_size=1)
        try:
            n = ds.num_samples
            if n:
                for i in (0, n - 1):
                    sample = ds[i]
                    if sample["input_ids"].ndim != 1 or "label" not in sample:
                        raise ValueError(
                            f"{split_dir}: sample does not decode to input_ids + label"
                        )
                del sample
        finally:
            release_streaming_dataset(ds)
    return n
