"""Bounded-memory validation, slice workers, merged MDS, the token cache and the fan-out runner.

The workers run in this process here (``finetune_assets_tests/data_path.py``: the assets' plan, the
workers' own command line), so slicing invariance and cache reuse are checked in seconds; the
subprocess path has its own tests below.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from finetune_assets.core.io import contracts
from finetune_assets.core.io.contracts import ACCEPTED_SCHEMA, REJECTED_SCHEMA, SPLITS
from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET
from finetune_assets.core.launchers.fanout import FanOut, FanOutError, LocalFanOutRunner
from finetune_assets.core.prep.conflicts import accepted_after, promoted_rows, rejected_after
from finetune_assets.core.prep.pretrained import packaged_model_dir
from finetune_assets.core.prep.validate import SplitRule, StreamValidator, ValidationRules, validate
from finetune_assets.core.shards import plan as slice_plan
from finetune_assets.core.shards import slices
from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets_tests.data_path import Tokenized, shard, tokenize


def test_plan_slices_cover_every_row_group_once_in_order():
    groups = [5, 5, 5, 5, 5, 5, 5, 3]
    for workers, slice_rows in ((1, 1000), (2, 1000), (3, 10), (16, 1000), (1, 1)):
        plan = slices.plan_slices(groups, workers, slice_rows)
        assert [a for a, _ in plan] == [0] + [b for _, b in plan[:-1]] and plan[-1][1] == len(
            groups
        )
        assert all(b > a for a, b in plan)
        wanted = max(workers, -(-sum(groups) // slice_rows))
        assert len(plan) == min(len(groups), -(-wanted // workers) * workers)  # no idle last round
    assert slices.plan_slices([], 2, 10) == []


def test_stream_validator_in_many_small_batches_equals_one_pass(arabic_reviews: Path):
    """Duplicates across batch boundaries are found (on-disk hash index), with the same details
    and counts.
    """
    # three files: duplicates within and across them
    raw = read_source(SourceSpec(uri=str(arabic_reviews)))
    whole = validate(raw, ValidationRules())
    rules = ValidationRules()
    streamed = StreamValidator(rules)
    parts = [streamed.feed(raw.slice(i, 97)) for i in range(0, raw.num_rows, 97)]
    plan = streamed.conflicts()  # copies with different labels, decided once all are seen
    streamed.close()
    moved: list[dict] = []
    rejected_parts = [p.rejected for p in parts]
    promoted = promoted_rows(plan, rejected_parts, rules.split.split_of_text, ACCEPTED_SCHEMA)
    accepted = pa.concat_tables(
        accepted_after(plan, [p.accepted for p in parts], promoted, moved, REJECTED_SCHEMA)
    )
    rejected = pa.concat_tables(rejected_after(plan, rejected_parts, moved, REJECTED_SCHEMA))
    streamed.recount(accepted, rejected, first=True)
    assert accepted.equals(whole.accepted) and rejected.equals(whole.rejected)
    assert streamed.rows_in == raw.num_rows == streamed.accepted + streamed.rejected
    assert dict(streamed.reasons) == whole.reasons and whole.reasons.get("duplicate", 0) > 0
    assert dict(streamed.across) == whole.cross_file_duplicates
    assert streamed.label_counts == whole.label_counts


# -- slice workers, in process ---------------------------------------------------------------------
def _reviews(
    tmp_path: Path,
    arabic_reviews: Path,
    rows: int | None = None,
    extra: list[str] = (),
    group: int = 100,
) -> str:
    accepted = validate(
        read_source(SourceSpec(uri=str(arabic_reviews / "PROD.csv"))), ValidationRules()
    ).accepted
    if rows is not None:
        accepted = accepted.slice(0, rows)
    if extra:
        more = pa.table(
            {
                "text": list(extra),
                "label": ["Positive"] * len(extra),
                "source_file": ["x"] * len(extra),
                "source_row": list(range(len(extra))),
                "split": SplitRule().assign(list(extra)),
            },
            schema=ACCEPTED_SCHEMA,
        )
        accepted = pa.concat_tables([accepted, more])
    path = tmp_path / f"reviews-{rows}-{len(extra)}.parquet"
    pq.write_table(accepted, path, row_group_size=group)
    return str(path)


def _tokenize(
    tmp_path: Path,
    name: str,
    reviews: str,
    workers: int,
    cache: str | None = None,
    max_length: int = 64,
) -> Tokenized:
    """tokenized_reviews of ``reviews`` into ``tmp_path / name``: as many slices as ``workers``,
    small batches (37 rows) so that batches, row groups and slices never line up.
    """
    return tokenize(
        reviews,
        packaged_model_dir(),
        tmp_path / name,
        max_length,
        workers=workers,
        slice_rows=10**9,
        batch_size=37,
        cache=cache,
    )


def _samples(split_dir: Path) -> list[tuple[tuple[int, ...], int]]:
    from finetune_assets.core.shards.mds import open_streaming_dataset, release_streaming_dataset

    if not json.loads((split_dir / "index.json").read_text())["shards"]:
        return []
    import tempfile

    # read as the trainer does: remote = the published folder
    with tempfile.TemporaryDirectory() as cache:
        ds = open_streaming_dataset(remote=str(split_dir), local=cache, shuffle=False, batch_size=1)
        try:
            return [
                (tuple(int(x) for x in ds[i]["input_ids"]), int(ds[i]["label"]))
                for i in range(ds.num_samples)
            ]
        finally:
            release_streaming_dataset(ds)


def _shards(tmp_path: Path, name: str, tokens: Tokenized) -> tuple[Path, dict]:
    """mds_shards of ``tokens`` by 2 shard workers (see the test), small shards."""
    out = tmp_path / name
    return out, shard(tokens, out, size_limit=1 << 12, workers=2)


def test_output_is_the_same_samples_in_the_same_order_whatever_the_slicing(
    arabic_reviews, tokenizer, tmp_path, monkeypatch
):
    reviews = _reviews(tmp_path, arabic_reviews, rows=900)
    one = _tokenize(tmp_path, "tok1", reviews, workers=1)
    three = _tokenize(tmp_path, "tok3", reviews, workers=3)
    assert len(three.parts) == 3 and three.rows == 900
    # the concatenated parts are, row for row, the Hugging Face tokenizer's own truncation, the
    # full lengths and raw_reviews' split and label
    rows = pq.read_table(reviews)
    texts = rows.column("text").to_pylist()
    expected = {
        "input_ids": tokenizer(texts, truncation=True, max_length=64)["input_ids"],
        "full_length": [len(x) for x in tokenizer(texts)["input_ids"]],
        "split": rows.column("split").cast(pa.string()).to_pylist(),
        "label": [DEFAULT_LABEL_SET.names.index(x) for x in rows.column("label").to_pylist()],
    }
    for tokens in (one, three):
        got = tokens.table()
        assert got.column("input_ids").to_pylist() == expected["input_ids"]
        assert got.column("split").cast(pa.string()).to_pylist() == expected["split"]
        assert got.column("full_length").to_pylist() == expected["full_length"]
        assert got.column("label").to_pylist() == expected["label"]
    # 2 shard workers even for 900 rows, each writing its range of parts
    monkeypatch.setattr(slice_plan, "SHARD_ROWS_PER_WORKER", 1)
    dir1, merged1 = _shards(tmp_path, "mds1", one)
    dir3, merged3 = _shards(tmp_path, "mds3", three)
    assert sum(m.samples for m in merged1.values()) == 900
    for split in SPLITS:
        a, b = _samples(dir1 / split), _samples(dir3 / split)
        assert a == b and len(a) == merged1[split].samples == merged3[split].samples
        assert merged3[split].shards > 1  # several sub-datasets really were joined
        stats = json.loads((dir3 / split / "split_stats.json").read_text())
        assert stats["samples"] == len(b)
        assert stats["label_counts"] == {
            str(k): v for k, v in zip(*np.unique([lbl for _, lbl in b], return_counts=True))
        }
    # what the trainer's config carries: the merged split_stats.json through its typed reader
    for split in SPLITS:
        if merged3[split].samples:
            counts = contracts.read_split_stats(str(dir3 / split)).counts(3)
            assert counts == [
                sum(1 for _, lbl in b_ if lbl == i)
                for i in range(3)
                for b_ in [_samples(dir3 / split)]
            ]
            index = json.loads((dir3 / split / "index.json").read_text())
            assert all("/" in s["zip_data"]["basename"] for s in index["shards"])
    train = [
        (tuple(ids), lbl)
        for ids, lbl, s in zip(expected["input_ids"], expected["label"], expected["split"])
        if s == "train"
    ]
    assert _samples(dir3 / "train") == train  # merged order = reviews.parquet row order


def test_cache_reuses_shared_rows_and_gives_identical_tokens(arabic_reviews, tmp_path):
    cache = str(tmp_path / "cache" / "ns")
    first = _reviews(tmp_path, arabic_reviews, rows=300)
    stats = _tokenize(tmp_path, "v1", first, workers=2, cache=cache).parts
    assert sum(s["new"] for s in stats) == 300 and sum(s["reused"] for s in stats) == 0
    extra = [f"مراجعة جديدة رقم {i}" for i in range(20)]
    second = _reviews(tmp_path, arabic_reviews, rows=300, extra=extra)
    cached = _tokenize(tmp_path, "v2", second, workers=3, cache=cache)
    stats = cached.parts
    assert sum(s["reused"] for s in stats) == 300 and sum(s["new"] for s in stats) == 20
    fresh = _tokenize(tmp_path, "v2-fresh", second, workers=1, cache=None)
    assert cached.table().equals(fresh.table())
    # another max_length is another namespace in the asset; within one, a third run reuses
    # everything
    stats = _tokenize(tmp_path, "v3", second, workers=1, cache=cache).parts
    assert sum(s["reused"] for s in stats) == 320


def test_a_cache_segment_appears_whole_after_its_slice_or_not_at_all(tmp_path):
    """Segments are written batch by batch but published only when the slice is done: a worker
    killed or failing mid-slice leaves nothing a later lookup could half-read.
    """
    from finetune_assets.core.prep.token_cache import TokenCache, text_keys

    cache = TokenCache(str(tmp_path / "ns"))
    texts = [f"review {i}" for i in range(10)]
    ids = pa.array([[101, i, 102] for i in range(10)], pa.list_(pa.uint16()))
    full = np.full(10, 3, dtype=np.int32)
    with pytest.raises(RuntimeError):
        with cache.segment() as segment:
            segment.write(text_keys(texts[:5]), ids.slice(0, 5), full[:5])
            raise RuntimeError("worker failed mid-slice")
    assert not cache.has_segments()
    # no partial file either
    assert not (tmp_path / "ns").exists() or not any((tmp_path / "ns").iterdir())
    with cache.segment() as segment:
        for start, stop in ((0, 4), (4, 7), (7, 10)):  # three batches, one segment
            segment.write(
                text_keys(texts[start:stop]), ids.slice(start, stop - start), full[start:stop]
            )
    assert sorted(p.suffix for p in (tmp_path / "ns").iterdir()) == [".arrow", ".keys"]
    hits = cache.lookup(text_keys(["unknown", *texts[::-1]]), np.dtype(np.uint16))
    assert sorted(hits.rows.tolist()) == list(range(1, 11))
    by_row = dict(zip(hits.rows.tolist(), hits.ids.to_pylist()))
    assert all(by_row[1 + j] == [101, 9 - j, 102] for j in range(10))


def _segment(cache, texts: list[str], first_token: int = 0) -> None:
    """One published segment: text ``j`` -> ids ``[101, first_token + j, 102]``."""
    from finetune_assets.core.prep.token_cache import text_keys

    ids = pa.array([[101, first_token + j, 102] for j in range(len(texts))], pa.list_(pa.uint16()))
    with cache.segment() as segment:
        segment.write(text_keys(texts), ids, np.full(len(texts), 3, np.int32))


def _looked_up(cache, texts: list[str]) -> dict[int, list[int]]:
    from finetune_assets.core.prep.token_cache import text_keys

    hits = cache.lookup(text_keys(texts), np.dtype(np.uint16))
    return dict(zip(hits.rows.tolist(), hits.ids.to_pylist()))


@pytest.mark.parametrize("root", ["local", "memory"])
def test_the_cache_index_finds_what_the_segments_hold_and_supersedes_older_indexes(tmp_path, root):
    """compact() merges new segments into one sorted index (in key-range chunks: 7 entries a chunk
    here); lookups through it give the tokens the segments hold; a segment no index lists yet is
    still found; the next compaction lists both and drops the index it supersedes. ``memory``: an
    object-store root, where a worker downloads the index once instead of memory-mapping it.
    """
    import fsspec

    from finetune_assets.core.prep.token_cache import INDEX_DIR, TokenCache

    url = str(tmp_path / "ns") if root == "local" else f"memory://cache-{tmp_path.name}/ns"
    cache = TokenCache(url)
    first = [f"review {i}" for i in range(40)]
    second = [f"other {i}" for i in range(25)]
    _segment(cache, first[:30])
    _segment(cache, first[30:], first_token=30)
    assert cache.compact(chunk_rows=7) == {
        "index_rows": 40,
        "indexed_segments": 2,
        "merged_segments": 2,
    }
    fs, path = fsspec.core.url_to_fs(url)
    index_files = sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{path}/{INDEX_DIR}", detail=False))
    assert [f.rsplit(".", 1)[1] for f in index_files] == ["idx", "json"]
    # the index is sorted by key and holds every (segment, row) once
    names, runs, loose = cache._runs()
    assert loose == [] and len(runs) == 1
    run = runs[0]
    assert np.all(
        (run.hi[1:] > run.hi[:-1]) | ((run.hi[1:] == run.hi[:-1]) & (run.lo[1:] >= run.lo[:-1]))
    )
    held = sorted((names[seg], row) for seg, row in zip(run.seg.tolist(), run.row.tolist()))
    sizes = sorted(sum(1 for n, _ in held if n == name) for name in names)
    # each (segment, row) once
    assert sizes == [10, 30] and held == sorted({(n, r) for n, r in held})
    assert all(
        sorted(r for n, r in held if n == name) == list(range(size))
        for name, size in ((name, sum(1 for n, _ in held if n == name)) for name in names)
    )
    got = _looked_up(cache, ["unknown", *first[::-1]])
    assert sorted(got) == list(range(1, 41)) and all(
        got[1 + j] == [101, 39 - j, 102] for j in range(40)
    )
    _segment(cache, second, first_token=100)  # a version after the compaction: a loose segment
    got = _looked_up(cache, [second[3], first[5], "unknown"])
    assert got == {0: [101, 103, 102], 1: [101, 5, 102]}
    assert cache.compact(chunk_rows=7) == {
        "index_rows": 65,
        "indexed_segments": 3,
        "merged_segments": 1,
    }
    assert len(fs.ls(f"{path}/{INDEX_DIR}", detail=False)) == 2  # the older index is gone
    assert cache._runs()[2] == []
    assert _looked_up(cache, [second[3], first[5], "unknown"]) == {
        0: [101, 103, 102],
        1: [101, 5, 102],
    }
    # re-run: no-op
    assert cache.compact() == {
        "index_rows": 65,
        "indexed_segments": 3,
        "merged_segments": 0,
    }


def test_the_cache_index_tells_keys_apart_that_share_their_first_half(tmp_path):
    """Binary search is on the keys' first 8 bytes; keys equal there must still be told apart by
    the rest.
    """
    from finetune_assets.core.prep.token_cache import TokenCache
    from finetune_assets.core.prep.token_index import KEY_BYTES, KeyRun, key_halves

    keys = np.zeros((6, KEY_BYTES), np.uint8)
    keys[:, 8] = [5, 1, 9, 3, 7, 2]  # the same hi, lo differs
    keys[5, 0] = 1  # one with another hi
    run = KeyRun.of_segment(keys, seg=0)
    # last: lo 0, absent
    probe = np.concatenate([keys[[2, 0, 3, 5]], np.zeros((1, KEY_BYTES), np.uint8)])
    pos = run.find(*key_halves(probe))
    assert run.row[pos[:4]].tolist() == [2, 0, 3, 5] and pos[4] == -1
    cache = TokenCache(str(tmp_path / "ns"))
    ids = pa.array([[101, j, 102] for j in range(6)], pa.list_(pa.uint16()))
    with cache.segment() as segment:
        segment.write(keys, ids, np.full(6, 3, np.int32))
    cache.compact(chunk_rows=2)
    hits = cache.lookup(probe, np.dtype(np.uint16))
    assert dict(zip(hits.rows.tolist(), hits.ids.to_pylist())) == {
        0: [101, 2, 102],
        1: [101, 0, 102],
        2: [101, 3, 102],
        3: [101, 5, 102],
    }


def test_indexes_published_concurrently_are_merged_and_a_missing_segment_is_a_miss(tmp_path):
    """Two versions compacting at once publish two indexes, neither listing the other's segment:
    lookups use the larger plus the other's segment as loose; the next compaction supersedes both. A
    segment whose tokens are gone makes its rows misses (tokenized anew), not an error; an index
    naming a segment that is gone is not used.
    """
    from finetune_assets.core.prep.token_cache import INDEX_DIR, TokenCache

    a, b = [f"a {i}" for i in range(10)], [f"b {i}" for i in range(5)]
    left, right = tmp_path / "left", tmp_path / "right"
    _segment(TokenCache(str(left)), a)
    _segment(TokenCache(str(right)), b, first_token=50)
    TokenCache(str(left)).compact()
    TokenCache(str(right)).compact()
    b_segment = next(right.glob("*.arrow")).stem
    # both writers' files in one cache, as two concurrent versions would leave them
    ns = tmp_path / "ns"
    shutil.copytree(left, ns)
    shutil.copytree(right, ns, dirs_exist_ok=True)
    cache = TokenCache(str(ns))
    names, runs, loose = cache._runs()
    # the larger index, the other segment loose
    assert len(runs) == 1 and len(runs[0]) == 10 and len(loose) == 1
    assert len(_looked_up(cache, a + b)) == 15
    assert cache.compact()["merged_segments"] == 1
    assert len(list((ns / INDEX_DIR).iterdir())) == 2  # both older indexes superseded
    assert len(_looked_up(cache, a + b)) == 15
    (ns / f"{b_segment}.arrow").unlink()
    assert sorted(_looked_up(cache, a + b)) == list(range(10))  # b's rows: misses
    (ns / f"{b_segment}.keys").unlink()
    assert cache._runs()[1] == []  # the index names a segment that is gone: not used
    assert sorted(_looked_up(cache, a + b)) == list(range(10))  # a's segment, searched loose


# -- the local fan-out runner ----------------------------------------------------------------------
_WORKER = r"""
import os, sys, time, pathlib
i = int(os.environ["JOB_COMPLETION_INDEX"])
d = pathlib.Path(sys.argv[1])
(d / f"running-{i}").touch()
print(f"hello from {i}", flush=True)
time.sleep(0.3)
peers = len(list(d.glob("running-*")))
(d / f"peers-{i}").write_text(str(peers))
(d / f"running-{i}").unlink()
if i in {int(x) for x in sys.argv[2:]}:
    print(f"slice {i} is broken", flush=True)
    sys.exit(3)
"""


def test_local_runner_runs_every_index_at_most_workers_at_a_time(tmp_path):
    lines: list[str] = []
    LocalFanOutRunner(workers=2).run(
        FanOut("t", [sys.executable, "-c", _WORKER, str(tmp_path)], 5, {}), lines.append
    )
    assert sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("peers-*")) == [0, 1, 2, 3, 4]
    assert max(int(p.read_text()) for p in tmp_path.glob("peers-*")) <= 2
    assert {f"[{i}] hello from {i}" for i in range(5)} <= set(lines)


def test_local_runner_names_the_failed_indexes_and_their_last_lines(tmp_path):
    with pytest.raises(FanOutError) as err:
        LocalFanOutRunner(workers=2).run(
            FanOut("t", [sys.executable, "-c", _WORKER, str(tmp_path), "1"], 3, {"X": "1"}),
            lambda _: None,
        )
    assert err.value.failed.keys() == {1} and err.value.failed[1][0] == 3
    assert "index 1 exited 3" in str(err.value) and "slice 1 is broken" in str(err.value)


# -- through Dagster: a failed slice publishes nothing ---------------------------------------------
class CrashingSliceRunner:
    """Test double of a fan-out runner: the real LocalFanOutRunner and real slice workers, except
    that slice 1's process prints a line and exits 7 before doing any work (a crashed pod /
    OOM-killed worker). It fakes only which process dies; ordering, concurrency and the other
    slices' output are real.
    """

    def __init__(self):
        self.workers = 2

    def run(self, job, log):
        import dataclasses

        crash = (
            "import os, runpy, sys\n"
            "if os.environ['JOB_COMPLETION_INDEX'] == '1':\n"
            "    print('slice 1 killed', flush=True); sys.exit(7)\n"
            "sys.argv = ['slices', *sys.argv[1:]]\n"
            "runpy.run_module('finetune_assets.core.shards.slices', run_name='__main__')\n"
        )
        # job.command = [python, -m, module, ...]
        command = [
            job.command[0],
            "-c",
            crash,
            *job.command[3:],
        ]
        LocalFanOutRunner(self.workers).run(dataclasses.replace(job, command=command), log)


@pytest.mark.slow
@pytest.mark.parametrize("asset", ["tokenized_reviews", "mds_shards"])
def test_a_failed_slice_fails_the_step_and_publishes_nothing(
    asset, storage_root, instance, tiny_model_dir, arabic_reviews, monkeypatch
):
    import finetune_assets.defs.resources.launchers as launchers
    from finetune_assets.core.io.storage import ATTEMPTS, Storage
    from finetune_assets.defs.versions.register import register_version
    from finetune_assets_tests.defs.data.test_data_assets import _failure_message, materialize

    store = Storage(str(storage_root))
    materialize(storage_root, instance, ["pretrained_model"], tiny_model_dir=tiny_model_dir)
    register_version(instance, store, "v1", SourceSpec(uri=str(arabic_reviews / "RES2.csv")))
    upstream = ["raw_reviews", "tokenized_reviews"][: 1 if asset == "tokenized_reviews" else 2]
    materialize(storage_root, instance, upstream, "v1", raw_config={"batch_rows": 300})
    assert (
        asset == "tokenized_reviews"
        or store.require("tokenized_reviews", "v1").metadata["parts"] >= 2
    )
    monkeypatch.setattr(launchers, "fanout_runner", lambda *a, **kw: CrashingSliceRunner())
    # a small version still gets 2 shard workers
    monkeypatch.setattr(slice_plan, "SHARD_ROWS_PER_WORKER", 1)
    result = materialize(
        storage_root,
        instance,
        [asset],
        "v1",
        raise_on_error=False,
        extra_ops={"tokenized_reviews": {"config": {"max_length": 128, "workers": 2}}},
    )
    assert not result.success
    message = _failure_message(result)
    assert "index 1 exited 7" in message and "slice 1 killed" in message
    assert store.current(asset, "v1") is None
    attempts = storage_root / asset / "v1" / ATTEMPTS
    # the parts the other slices wrote are gone
    assert not attempts.exists() or not any(attempts.iterdir())
