"""Bounded-memory validation, slice workers, merged MDS, the token cache and the fan-out runner (issue 15).

The workers run in this process here (``tokenize_slice`` / ``shard_slice`` are what the CLI calls), so
slicing invariance and cache reuse are checked in seconds; the subprocess path has its own tests below.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from finetune_assets import contracts
from finetune_assets.data import slices
from finetune_assets.data.labels import DEFAULT_LABEL_SET
from finetune_assets.data.sources import SourceSpec, read_source
from finetune_assets.contracts import ACCEPTED_SCHEMA, SPLITS
from finetune_assets.data.tokenize import token_dtype, tokenize_table
from finetune_assets.data.validate import SplitRule, StreamValidator, ValidationRules, validate
from finetune_assets.launchers.fanout import FanOut, FanOutError, LocalFanOutRunner


def test_plan_slices_cover_every_row_group_once_in_order():
    groups = [5, 5, 5, 5, 5, 5, 5, 3]
    for workers, slice_rows in ((1, 1000), (2, 1000), (3, 10), (16, 1000), (1, 1)):
        plan = slices.plan_slices(groups, workers, slice_rows)
        assert [a for a, _ in plan] == [0] + [b for _, b in plan[:-1]] and plan[-1][1] == len(groups)
        assert all(b > a for a, b in plan)
        wanted = max(workers, -(-sum(groups) // slice_rows))
        assert len(plan) == min(len(groups), -(-wanted // workers) * workers)  # no idle last round
    assert slices.plan_slices([], 2, 10) == []


def test_stream_validator_in_many_small_batches_equals_one_pass(arabic_reviews: Path):
    """Duplicates across batch boundaries are found (on-disk hash index), with the same details and counts."""
    raw = read_source(SourceSpec(uri=str(arabic_reviews)))  # three files: duplicates within and across them
    whole = validate(raw, ValidationRules())
    streamed = StreamValidator(ValidationRules())
    parts = [streamed.feed(raw.slice(i, 97)) for i in range(0, raw.num_rows, 97)]
    streamed.close()
    accepted = pa.concat_tables(p.accepted for p in parts)
    rejected = pa.concat_tables(p.rejected for p in parts)
    assert accepted.equals(whole.accepted) and rejected.equals(whole.rejected)
    assert streamed.rows_in == raw.num_rows == streamed.accepted + streamed.rejected
    assert dict(streamed.reasons) == whole.reasons and whole.reasons.get("duplicate", 0) > 0
    assert dict(streamed.across) == whole.cross_file_duplicates
    assert streamed.label_counts == whole.label_counts


# -- slice workers, in process -------------------------------------------------------------------------
def _reviews(tmp_path: Path, arabic_reviews: Path, rows: int | None = None, extra: list[str] = (),
             group: int = 100) -> str:
    accepted = validate(read_source(SourceSpec(uri=str(arabic_reviews / "PROD.csv"))), ValidationRules()).accepted
    if rows is not None:
        accepted = accepted.slice(0, rows)
    if extra:
        more = pa.table({"text": list(extra), "label": ["Positive"] * len(extra), "source_file": ["x"] * len(extra),
                         "source_row": list(range(len(extra))), "split": SplitRule().assign(list(extra))},
                        schema=ACCEPTED_SCHEMA)
        accepted = pa.concat_tables([accepted, more])
    path = tmp_path / f"reviews-{rows}-{len(extra)}.parquet"
    pq.write_table(accepted, path, row_group_size=group)
    return str(path)


def _tokenize(tmp_path: Path, name: str, reviews: str, tokenizer, workers: int, cache: str | None = None,
              max_length: int = 64) -> tuple[str, list[dict]]:
    groups = [pq.ParquetFile(reviews).metadata.row_group(i).num_rows
              for i in range(pq.ParquetFile(reviews).metadata.num_row_groups)]
    plan = slices.plan_slices(groups, workers, slice_rows=10**9)
    out = tmp_path / name
    tok = tmp_path / "tokenizer.json"
    tokenizer.backend_tokenizer.no_truncation()
    tok.write_text(tokenizer.backend_tokenizer.to_str())
    spec = slices.TokenizeSpec(reviews=reviews, out=str(out), slices=plan, tokenizer=str(tok),
                               dtype=token_dtype(len(tokenizer)).name, max_length=max_length,
                               labels=DEFAULT_LABEL_SET.to_dict(), batch_size=37, cache=cache)
    stats = [slices.tokenize_slice(spec, i, log=lambda m: None) for i in range(len(plan))]
    return str(out), stats


def _samples(split_dir: Path) -> list[tuple[tuple[int, ...], int]]:
    from finetune_assets.data.shards import open_streaming_dataset

    if not json.loads((split_dir / "index.json").read_text())["shards"]:
        return []
    import tempfile

    with tempfile.TemporaryDirectory() as cache:  # read as the trainer does: remote = the published folder
        ds = open_streaming_dataset(remote=str(split_dir), local=cache, shuffle=False, batch_size=1)
        out = [(tuple(int(x) for x in ds[i]["input_ids"]), int(ds[i]["label"])) for i in range(ds.num_samples)]
        del ds
    return out


def _shards(tmp_path: Path, name: str, tokens: str, count: int) -> tuple[Path, dict]:
    out = tmp_path / name
    spec = slices.ShardsSpec(tokens=tokens, out=str(out), groups=slices.group_parts(count, 2), size_limit=1 << 12)
    for i in range(spec.count):
        slices.shard_slice(spec, i, log=lambda m: None)
    return out, slices.merge_shards(str(out), out, count)


def test_output_is_the_same_samples_in_the_same_order_whatever_the_slicing(arabic_reviews, tokenizer, tmp_path):
    reviews = _reviews(tmp_path, arabic_reviews, rows=900)
    one, _ = _tokenize(tmp_path, "tok1", reviews, tokenizer, workers=1)
    three, stats = _tokenize(tmp_path, "tok3", reviews, tokenizer, workers=3)
    assert len(stats) == 3 and sum(s["rows"] for s in stats) == 900
    # the concatenated parts are exactly what the one-process tokenize_table gives, row for row
    expected = tokenize_table(pq.read_table(reviews), tokenizer, 64)
    for url in (one, three):
        got = pa.Table.from_batches(list(contracts.iter_token_batches(url)))
        assert got.column("input_ids").to_pylist() == expected.column("input_ids").to_pylist()
        assert got.column("split").cast(pa.string()).to_pylist() == \
            expected.column("split").cast(pa.string()).to_pylist()
        assert got.column("full_length").to_pylist() == expected.column("full_length").to_pylist()
    dir1, merged1 = _shards(tmp_path, "mds1", one, 1)
    dir3, merged3 = _shards(tmp_path, "mds3", three, 3)
    assert sum(m["samples"] for m in merged1.values()) == 900
    for split in SPLITS:
        a, b = _samples(dir1 / split), _samples(dir3 / split)
        assert a == b and len(a) == merged1[split]["samples"] == merged3[split]["samples"]
        assert merged3[split]["shards"] > 1  # several sub-datasets really were joined
        stats = json.loads((dir3 / split / "split_stats.json").read_text())
        assert stats["samples"] == len(b)
        assert stats["label_counts"] == {str(k): v for k, v in
                                         zip(*np.unique([lbl for _, lbl in b], return_counts=True))}
    # what the trainer's config carries: the merged split_stats.json through its typed reader
    for split in SPLITS:
        if merged3[split]["samples"]:
            counts = contracts.read_split_stats(str(dir3 / split)).counts(3)
            assert counts == [sum(1 for _, lbl in b_ if lbl == i) for i in range(3) for b_ in [_samples(dir3 / split)]]
            index = json.loads((dir3 / split / "index.json").read_text())
            assert all("/" in s["zip_data"]["basename"] for s in index["shards"])
    mask = expected.column("split").cast(pa.string()).to_pylist()
    train = [(tuple(ids), lbl) for ids, lbl, s in zip(expected.column("input_ids").to_pylist(),
                                                       expected.column("label").to_pylist(), mask) if s == "train"]
    assert _samples(dir3 / "train") == train  # merged order = reviews.parquet row order


def test_cache_reuses_shared_rows_and_gives_identical_tokens(arabic_reviews, tokenizer, tmp_path):
    cache = str(tmp_path / "cache" / "ns")
    first = _reviews(tmp_path, arabic_reviews, rows=300)
    _, stats = _tokenize(tmp_path, "v1", first, tokenizer, workers=2, cache=cache)
    assert sum(s["new"] for s in stats) == 300 and sum(s["reused"] for s in stats) == 0
    extra = [f"مراجعة جديدة رقم {i}" for i in range(20)]
    second = _reviews(tmp_path, arabic_reviews, rows=300, extra=extra)
    cached_url, stats = _tokenize(tmp_path, "v2", second, tokenizer, workers=3, cache=cache)
    assert sum(s["reused"] for s in stats) == 300 and sum(s["new"] for s in stats) == 20
    fresh_url, _ = _tokenize(tmp_path, "v2-fresh", second, tokenizer, workers=1, cache=None)
    cached = pa.Table.from_batches(list(contracts.iter_token_batches(cached_url)))
    fresh = pa.Table.from_batches(list(contracts.iter_token_batches(fresh_url)))
    assert cached.equals(fresh)
    # another max_length is another namespace in the asset; within one, a third run reuses everything
    _, stats = _tokenize(tmp_path, "v3", second, tokenizer, workers=1, cache=cache)
    assert sum(s["reused"] for s in stats) == 320


def test_a_cache_segment_appears_whole_after_its_slice_or_not_at_all(tmp_path):
    """Segments are written batch by batch but published only when the slice is done: a worker killed or
    failing mid-slice leaves nothing a later lookup could half-read."""
    from finetune_assets.data.token_cache import TokenCache, text_keys

    cache = TokenCache(str(tmp_path / "ns"))
    texts = [f"review {i}" for i in range(10)]
    ids = pa.array([[101, i, 102] for i in range(10)], pa.list_(pa.uint16()))
    full = np.full(10, 3, dtype=np.int32)
    with pytest.raises(RuntimeError):
        with cache.segment() as segment:
            segment.write(text_keys(texts[:5]), ids.slice(0, 5), full[:5])
            raise RuntimeError("worker failed mid-slice")
    assert not cache.has_segments()
    assert not (tmp_path / "ns").exists() or not any((tmp_path / "ns").iterdir())  # no partial file either
    with cache.segment() as segment:
        for start, stop in ((0, 4), (4, 7), (7, 10)):  # three batches, one segment
            segment.write(text_keys(texts[start:stop]), ids.slice(start, stop - start), full[start:stop])
    assert sorted(p.suffix for p in (tmp_path / "ns").iterdir()) == [".arrow", ".keys"]
    hits = cache.lookup(text_keys(["unknown", *texts[::-1]]), np.dtype(np.uint16))
    assert sorted(hits.rows.tolist()) == list(range(1, 11))
    by_row = dict(zip(hits.rows.tolist(), hits.ids.to_pylist()))
    assert all(by_row[1 + j] == [101, 9 - j, 102] for j in range(10))


# -- the local fan-out runner ---------------------------------------------------------------------------------
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
    LocalFanOutRunner(workers=2).run(FanOut("t", [sys.executable, "-c", _WORKER, str(tmp_path)], 5, {}), lines.append)
    assert sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("peers-*")) == [0, 1, 2, 3, 4]
    assert max(int(p.read_text()) for p in tmp_path.glob("peers-*")) <= 2
    assert {f"[{i}] hello from {i}" for i in range(5)} <= set(lines)


def test_local_runner_names_the_failed_indexes_and_their_last_lines(tmp_path):
    with pytest.raises(FanOutError) as err:
        LocalFanOutRunner(workers=2).run(
            FanOut("t", [sys.executable, "-c", _WORKER, str(tmp_path), "1"], 3, {"X": "1"}), lambda _: None)
    assert err.value.failed.keys() == {1} and err.value.failed[1][0] == 3
    assert "index 1 exited 3" in str(err.value) and "slice 1 is broken" in str(err.value)


# -- through Dagster: a failed slice publishes nothing ---------------------------------------------------------
class CrashingSliceRunner:
    """Test double of a fan-out runner: the real LocalFanOutRunner and real slice workers, except that
    slice 1's process prints a line and exits 7 before doing any work (a crashed pod / OOM-killed worker).
    It fakes only which process dies; ordering, concurrency and the other slices' output are real."""

    def __init__(self):
        self.workers = 2

    def run(self, job, log):
        import dataclasses

        crash = ("import os, runpy, sys\n"
                 "if os.environ['JOB_COMPLETION_INDEX'] == '1':\n"
                 "    print('slice 1 killed', flush=True); sys.exit(7)\n"
                 "sys.argv = ['slices', *sys.argv[1:]]\n"
                 "runpy.run_module('finetune_assets.data.slices', run_name='__main__')\n")
        command = [job.command[0], "-c", crash, *job.command[3:]]  # job.command = [python, -m, module, ...]
        LocalFanOutRunner(self.workers).run(dataclasses.replace(job, command=command), log)


@pytest.mark.slow
@pytest.mark.parametrize("asset", ["tokenized_reviews", "mds_shards"])
def test_a_failed_slice_fails_the_step_and_publishes_nothing(asset, storage_root, instance, tiny_model_dir,
                                                             arabic_reviews, monkeypatch):
    import finetune_assets.launchers.select as select
    from finetune_assets.storage import ATTEMPTS, Storage
    from finetune_assets.dataset_versions.registry import register_version
    from finetune_assets_tests.test_assets_data import _failure_message, materialize

    store = Storage(str(storage_root))
    materialize(storage_root, instance, ["pretrained_model"], tiny_model_dir=tiny_model_dir)
    register_version(instance, store, "v1", SourceSpec(uri=str(arabic_reviews / "RES2.csv")))
    upstream = ["raw_reviews", "tokenized_reviews"][: 1 if asset == "tokenized_reviews" else 2]
    materialize(storage_root, instance, upstream, "v1", raw_config={"batch_rows": 300})
    assert asset == "tokenized_reviews" or store.require("tokenized_reviews", "v1").metadata["parts"] >= 2
    monkeypatch.setattr(select, "fanout_runner_from_env", lambda **kw: CrashingSliceRunner())
    monkeypatch.setattr(slices, "SHARD_ROWS_PER_WORKER", 1)  # a small version still gets 2 shard workers
    result = materialize(storage_root, instance, [asset], "v1", raise_on_error=False,
                         extra_ops={"tokenized_reviews": {"config": {"max_length": 128, "workers": 2}}})
    assert not result.success
    message = _failure_message(result)
    assert "index 1 exited 7" in message and "slice 1 killed" in message
    assert store.current(asset, "v1") is None
    attempts = storage_root / asset / "v1" / ATTEMPTS
    assert not attempts.exists() or not any(attempts.iterdir())  # the parts the other slices wrote are gone
