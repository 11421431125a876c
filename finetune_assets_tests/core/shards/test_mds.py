"""Opening and reading MDS splits back leaves nothing behind in a process that lives on.

streaming keeps a dataset's shared memory until the interpreter exits; the Dagster steps that read
splits back (``mds_shards``, its integrity check) run in long-lived processes too (in-process
executors, code servers), where each read used to keep six descriptors and six ``/dev/shm`` blocks:
a test session ran out of descriptors this way.

``/dev/shm`` and the temp dir are the host's: other processes (the other xdist lane, the plane's
pods, a training) open streaming datasets meanwhile, so only the blocks and lock files of the
prefixes this test's datasets took are compared.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from finetune_assets.core.shards import mds
from finetune_assets.core.shards.mds import (
    open_streaming_dataset,
    read_back_count,
    release_streaming_dataset,
)
from finetune_assets_tests.data_path import shard_tokens


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def ours(monkeypatch):
    """Of some ``/dev/shm`` or temp-dir names, those of the prefixes this test's datasets took
    (each open through the module is noted: ``read_back_count`` opens through it too).
    """
    prefixes: set[str] = set()

    def recording(*args, **kwargs):
        ds = open_streaming_dataset(*args, **kwargs)
        prefixes.add(f"{ds._shm_prefix_int:06}_")  # streaming's names: f"{prefix:06}_{what}"
        return ds

    monkeypatch.setattr(mds, "open_streaming_dataset", recording)
    return lambda names: {n for n in names if n[:7] in prefixes}


def _shm_blocks() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _lock_files() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.endswith("_filelock")}


def _split(tmp_path: Path) -> Path:
    rows = 40
    table = pa.table(
        {
            "input_ids": pa.array(
                [np.arange(1, 3 + i % 7, dtype=np.uint16) for i in range(rows)],
                pa.list_(pa.uint16()),
            ),
            "label": pa.array([i % 3 for i in range(rows)], pa.int64()),
            "split": pa.array(["train"] * rows),
        }
    )
    out = tmp_path / "shards"
    shard_tokens(table, out, size_limit=1 << 10)
    return out / "train"


def test_reading_back_many_times_keeps_no_descriptor_shared_memory_or_lock_file(tmp_path, ours):
    split = _split(tmp_path)
    assert read_back_count(split) == 40  # the first open imports and warms what stays loaded
    fds, shm, locks = _descriptors(), _shm_blocks(), _lock_files()

    for _ in range(25):
        assert read_back_count(split) == 40

    assert _descriptors() <= fds, "read_back_count keeps file descriptors open"
    assert ours(_shm_blocks() - shm) == set(), "read_back_count leaves /dev/shm blocks behind"
    assert ours(_lock_files() - locks) == set(), "read_back_count leaves lock files behind"


def test_released_dataset_frees_its_prefix_for_the_next_one(tmp_path):
    """streaming skips, for good, a prefix with any block or lock file left: none may stay."""
    split = _split(tmp_path)
    for i in range(3):
        ds = mds.open_streaming_dataset(
            remote=str(split), local=str(tmp_path / f"cache{i}"), shuffle=False, batch_size=1
        )
        assert int(ds[0]["label"]) == 0
        mine = f"{ds._shm_prefix_int:06}_"
        assert release_streaming_dataset(ds) >= 6  # locals, barrier, epoch, usage, 2 shard arrays
        left = [n for n in _shm_blocks() | _lock_files() if n.startswith(mine)]
        assert left == [], f"prefix {mine} not free for the next dataset: {left}"


def test_a_dataset_left_open_keeps_its_blocks(tmp_path, ours):
    """The control: without the release the blocks stay (what the tests above guard against)."""
    split = _split(tmp_path)
    shm = _shm_blocks()
    ds = mds.open_streaming_dataset(
        remote=str(split), local=str(tmp_path / "cache"), shuffle=False, batch_size=1
    )
    try:
        assert len(ours(_shm_blocks() - shm)) >= 6
    finally:
        release_streaming_dataset(ds)
    assert ours(_shm_blocks() - shm) == set()


def test_epochs_of_iteration_leave_nothing_once_released(tmp_path, ours):
    """What a training does to its train dataset: each epoch resets the resume state and iterates,
    and streaming attaches to the resume block each time, past what the dataset references.
    """
    split = _split(tmp_path)
    fds, shm = _descriptors(), _shm_blocks()
    ds = mds.open_streaming_dataset(
        remote=str(split), local=str(tmp_path / "cache"), shuffle=True, batch_size=4
    )
    for epoch in range(4):
        ds.load_state_dict(
            {"epoch": epoch, "sample_in_epoch": 0, "num_canonical_nodes": 1, "shuffle_seed": 9}
        )
        assert len(list(ds)) == 40
    leaked = _descriptors() - fds
    release_streaming_dataset(ds)
    assert ours(_shm_blocks() - shm) == set()
    assert _descriptors() <= fds, f"{leaked} descriptors before the sweep, some still open"


def test_opening_beside_a_live_dataset_keeps_nothing_of_it(tmp_path):
    """streaming's prefix scan attaches to every block of each live dataset it walks past."""
    split = _split(tmp_path)
    live = mds.open_streaming_dataset(
        remote=str(split), local=str(tmp_path / "live"), shuffle=False, batch_size=1
    )
    try:
        assert read_back_count(split) == 40
        fds = _descriptors()
        for _ in range(10):
            assert read_back_count(split) == 40
        assert _descriptors() <= fds, "each open kept descriptors of the live dataset's blocks"
        assert int(live[0]["label"]) == 0  # the live dataset's blocks still work
    finally:
        release_streaming_dataset(live)
