"""The train loader resumes at the exact consumed batch (with Lightning-style pre-fetch),
bucketed or not.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.training.config import DataConfig
from finetune_assets.core.training.data.collate import DynamicPaddingCollator
from finetune_assets.core.training.data.datamodule import balanced_class_weights
from finetune_assets.core.training.data.shard_cache import (
    cache_root,
    clean_stale_streaming_memory,
    split_locations,
)
from finetune_assets.core.training.data.streaming_loader import ResumableStreamingDataLoader
from finetune_assets_tests.core.training.fixtures import write_split

N = 203  # not a multiple of the batch or window size


@pytest.fixture
def synthetic_split(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    ids = [
        [101, 1000 + i, *rng.integers(2000, 3000, size=int(rng.integers(1, 60))).tolist(), 102]
        for i in range(N)
    ]
    return write_split(tmp_path / "train", ids, [i % 3 for i in range(N)], size_limit=1 << 12)


def _loader(
    open_dataset, split: Path, bucket: int, epoch: int = 0, shared: bool = True
) -> ResumableStreamingDataLoader:
    ds = open_dataset(
        local=str(split), batch_size=8 * bucket, shuffle=True, shuffle_seed=7, num_canonical_nodes=1
    )
    return ResumableStreamingDataLoader(
        ds,
        batch_size=8,
        collate_fn=DynamicPaddingCollator(),
        epoch_fn=lambda: epoch,
        world_size=1,
        bucket_batches=bucket,
        seed=7,
        num_workers=0,
        shared_order=shared,
    )


def _ids(batch) -> list[int]:
    return batch["input_ids"][:, 1].tolist()  # the unique second token of each sample


def _consume(it, loader, n: int) -> list[int]:
    """Take ``n`` batches the way Lightning does: fetch one ahead, mark each as consumed when
    used.
    """
    seen, ahead = [], next(it)
    for _ in range(n):
        batch, ahead = ahead, next(it, None)
        loader.mark_consumed(int(batch["labels"].shape[0]))
        seen += _ids(batch)
        if ahead is None:
            break
    return seen


@pytest.mark.parametrize("bucket", [1, 4])
@pytest.mark.parametrize("stop_after", [3, 5, 13])
def test_resume_neither_repeats_nor_skips(open_dataset, synthetic_split, bucket, stop_after):
    # only unused segments: other trainings on this machine keep theirs
    clean_stale_streaming_memory()
    full = _loader(open_dataset, synthetic_split, bucket)
    assert len(full) == -(-N // 8)
    reference = [i for batch in full for i in _ids(batch)]
    assert sorted(reference) == list(range(1000, 1000 + N))
    del full
    gc.collect()

    first = _loader(open_dataset, synthetic_split, bucket)
    it = iter(first)
    before = _consume(it, first, stop_after)
    state = first.state_dict()
    del it, first
    gc.collect()
    # only unused segments: other trainings on this machine keep theirs
    clean_stale_streaming_memory()

    second = _loader(open_dataset, synthetic_split, bucket)
    second.load_state_dict(state)
    after = [i for batch in second for i in _ids(batch)]
    assert before + after == reference  # same samples, same order, each exactly once
    assert len(before) == 8 * stop_after


def test_bucketing_reduces_padding(open_dataset, synthetic_split):
    # only unused segments: other trainings on this machine keep theirs
    clean_stale_streaming_memory()
    padded = {}
    for bucket in (1, 4):
        loader = _loader(open_dataset, synthetic_split, bucket)
        padded[bucket] = sum(int(b["input_ids"].numel()) for b in loader)
        del loader
        gc.collect()
    assert padded[4] < 0.8 * padded[1]


@pytest.mark.parametrize("shared", [True, False])
def test_every_rank_runs_the_same_length_bucket_at_each_step(
    open_dataset, tmp_path, synthetic_split, shared
):
    """Two ranks' streams (two splits of other samples) -> at each step both run the k-th shortest
    batch of their window; the old per-rank order (``shared=False``) does not.
    """
    rng = np.random.default_rng(1)
    ids = [
        [101, 5000 + i, *rng.integers(2000, 3000, size=int(rng.integers(1, 60))).tolist(), 102]
        for i in range(N)
    ]
    other = write_split(tmp_path / "other", ids, [i % 3 for i in range(N)], size_limit=1 << 12)
    clean_stale_streaming_memory()
    ranks = []
    for split in (synthetic_split, other):
        loader = _loader(open_dataset, split, 4, shared=shared)
        widths = [int(b["input_ids"].shape[1]) for b in loader]
        windows = [widths[i : i + 4] for i in range(0, len(widths), 4)]
        # each batch's length rank in its window
        ranks.append([sorted(w).index(x) for w in windows for x in w])
        del loader
        gc.collect()
    assert (ranks[0] == ranks[1]) is shared


def test_split_locations_never_read_published_shards_in_place(tmp_path, synthetic_split):
    # A local published folder is the remote too: streaming copies it into the cache, never writes
    # beside it.
    assert split_locations(str(synthetic_split), "/cache", "train") == (
        str(synthetic_split),
        "/cache/train",
    )
    assert split_locations(f"file://{synthetic_split}", "/cache", "train") == (
        str(synthetic_split),
        "/cache/train",
    )
    assert split_locations("s3://b/x/train", "/cache", "train") == (
        "s3://b/x/train",
        "/cache/train",
    )
    with pytest.raises(FileNotFoundError, match="no MDS dataset"):
        split_locations(str(tmp_path / "nope"), "/cache", "test")


def test_cache_root_is_shared_by_ranks_and_fresh_per_run_and_attempt(tmp_path, monkeypatch):
    data = DataConfig(train_url="/d/train", validation_url="/d/validation", test_url="/d/test")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    a, owned = cache_root(data, "ckpt-a")
    # every local rank of the node derives the same folder
    assert a == cache_root(data, "ckpt-a")[0]
    assert owned is not None and Path(a).parent == Path(owned)  # removed as a whole after success
    assert cache_root(data, "ckpt-b")[0] != a  # another run / other shards: another folder
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted, owned_again = cache_root(data, "ckpt-a")
    # a restarted group must not reuse folders that a killed worker's stale shared memory still
    # names
    assert restarted != a and owned_again == owned
    # the token the group agreed on keys the folder: fresh per start even where this agent's restart
    # count did not change (it restarted its workers for another node's failure)
    one, two = (
        cache_root(data, "ckpt-a", attempt="token-1"),
        cache_root(data, "ckpt-a", attempt="token-2"),
    )
    assert (
        one[0] != two[0]
        and one[1] == two[1] == owned
        and one == cache_root(data, "ckpt-a", attempt="token-1")
    )
    given = DataConfig(
        train_url="/d/train",
        validation_url="/d/validation",
        test_url="/d/test",
        local_cache_dir=str(tmp_path / "cache"),
    )
    # the caller's folder is kept
    assert cache_root(given, "ckpt-a") == (
        str(tmp_path / "cache"),
        None,
    )


def test_label_counts_and_balanced_weights(synthetic_split, tmp_path):
    # labels i % 3 over 203 samples
    assert read_split_stats(str(synthetic_split)).counts(3) == [
        68,
        68,
        67,
    ]
    skewed = write_split(tmp_path / "skewed", [[101, 7, 102]] * 10, [0] * 7 + [1] * 2 + [2])
    counts = read_split_stats(str(skewed)).counts(3)
    assert counts == [7, 2, 1]
    weights = balanced_class_weights(counts)
    assert weights == pytest.approx([10 / 21, 10 / 6, 10 / 3])  # n / (classes * count)
    # total weight unchanged
    assert sum(w * c for w, c in zip(weights, counts)) == pytest.approx(10)
    assert balanced_class_weights([5, 0, 5])[1] == 1.0  # absent class: never a target, any weight
    with pytest.raises(ValueError, match="non-empty train split"):
        balanced_class_weights([0, 0, 0])
