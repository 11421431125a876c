"""Kill a data asset mid-write (SIGKILL, no cleanup code runs) and run two partitions at once.

After a kill the published location still holds the previous complete version, or nothing; the
next materialization succeeds. Two processes materializing different partitions never touch each
other's files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finetune_assets.core.io.storage import ATTEMPTS, POINTER, Storage
from finetune_assets.core.sources import SourceSpec
from finetune_assets_tests.core.conftest import count_csv_rows

REPO = Path(__file__).resolve().parents[3]
DATA_ASSETS = ("raw_reviews", "tokenized_reviews", "mds_shards")


def _worker(root: Path, version: str, source: Path, assets, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "finetune_assets_tests.core.prep.materialize_worker",
            str(root),
            version,
            str(source),
            ",".join(assets),
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run(root: Path, version: str, source: Path, assets) -> None:
    proc = _worker(root, version, source, assets)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "materialized" in out, out[-4000:]


def _run_here(root: Path, instance, version: str, source: Path, assets) -> None:
    """In this process (cheaper than a worker), with the worker's config, so content hashes
    compare.
    """
    from finetune_assets.defs.versions.register import register_version
    from finetune_assets_tests.defs.data.test_data_assets import materialize

    register_version(instance, Storage(str(root)), version, SourceSpec(uri=str(source)))
    materialize(
        root,
        instance,
        list(assets),
        version,
        extra_ops={"mds_shards": {"config": {"size_limit": "32kb"}}},
    )


def _kill_when(proc: subprocess.Popen, marker: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"worker exited before the hang point: {proc.stdout.read()[-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("worker never reached the hang point")
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _attempt_dirs(root: Path, asset: str, version: str) -> set[str]:
    path = root / asset / version / ATTEMPTS
    return {p.name for p in path.iterdir()} if path.exists() else set()


@pytest.fixture
def model_root(storage_root: Path, tiny_model_dir: Path, instance) -> Path:
    from finetune_assets_tests.defs.data.test_data_assets import materialize

    materialize(storage_root, instance, ["pretrained_model"], tiny_model_dir=tiny_model_dir)
    return storage_root


@pytest.mark.slow
@pytest.mark.parametrize(
    "hang_in, asset", [("tokens", "tokenized_reviews"), ("shards", "mds_shards")]
)
@pytest.mark.parametrize("previous", [False, True], ids=["first_write", "over_previous"])
def test_sigkill_mid_write_keeps_previous_complete_version(
    hang_in, asset, previous, model_root: Path, instance, arabic_reviews: Path, tmp_path: Path
):
    store = Storage(str(model_root))
    source = arabic_reviews / "RES2.csv"
    before = None
    if previous:
        _run_here(model_root, instance, "v1", source, DATA_ASSETS)
        before = store.require(asset, "v1")
    else:
        upstream = DATA_ASSETS[: DATA_ASSETS.index(asset)]
        _run_here(model_root, instance, "v1", source, upstream)

    marker = tmp_path / "hung"
    proc = _worker(model_root, "v1", source, [asset], "--hang-in", hang_in, "--marker", str(marker))
    _kill_when(proc, marker)

    # the killed attempt left partial files behind, but nobody can see them through CURRENT
    partial = _attempt_dirs(model_root, asset, "v1") - ({before.attempt} if before else set())
    assert len(partial) == 1
    [partial_attempt] = partial
    assert any(
        p.is_file() for p in (model_root / asset / "v1" / ATTEMPTS / partial_attempt).rglob("*")
    )
    if previous:
        assert store.require(asset, "v1") == before
    else:
        assert store.current(asset, "v1") is None
        assert not (model_root / asset / "v1" / POINTER).exists()

    # the next materialization succeeds and publishes a complete version
    _run_here(model_root, instance, "v1", source, [asset])
    after = store.require(asset, "v1")
    assert after.attempt not in {partial_attempt, before.attempt if before else None}
    # same inputs, same content hash: the partial write did not leak into the new version
    if previous:
        assert after.data_version == before.data_version
    if asset == "mds_shards":
        from finetune_assets.core.shards.mds import read_back_count

        rows = store.require("tokenized_reviews", "v1").metadata["rows"]
        assert (
            sum(read_back_count(Path(after.url) / s) for s in ("train", "validation", "test"))
            == rows
        )
    else:
        from finetune_assets.core.io.contracts import read_tokens

        assert (
            read_tokens(after.url, store.fs).num_rows
            == store.require("raw_reviews", "v1").metadata["rows"]
        )


@pytest.mark.slow
def test_concurrent_materializations_of_two_partitions_never_share_files(
    model_root: Path, arabic_reviews: Path, tmp_path: Path, instance
):
    sources = {"v1": arabic_reviews / "ATT.csv", "v2": arabic_reviews / "RES2.csv"}
    procs = {v: _worker(model_root, v, src, DATA_ASSETS) for v, src in sources.items()}
    for version, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0 and "materialized" in out, (version, out[-4000:])

    store = Storage(str(model_root))
    files = {v: set() for v in sources}
    for asset in DATA_ASSETS:
        for version in sources:
            published = store.require(asset, version)
            assert Path(published.url).is_relative_to(model_root / asset / version)
            assert _attempt_dirs(model_root, asset, version) == {published.attempt}
            files[version] |= {p.resolve() for p in (model_root / asset / version).rglob("*")}
        assert sorted(p.name for p in (model_root / asset).iterdir()) == ["v1", "v2"]
    assert files["v1"] and files["v2"] and not files["v1"] & files["v2"]
    for version, src in sources.items():
        raw = store.require("raw_reviews", version).metadata
        assert raw["rows"] + raw["rejected"] == count_csv_rows(src)
        assert store.require("tokenized_reviews", version).metadata["rows"] == raw["rows"]
        shards = store.require(
            "mds_shards", version
        ).metadata  # samples per split (+ the label set)
        assert sum(shards[split] for split in ("train", "validation", "test")) == raw["rows"]

    # each result equals what a materialization on its own gives (content hashes): no cross-talk
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("pretrained_model",):
        os.symlink(model_root / name, alone / name)
    _run_here(alone, instance, "v2", sources["v2"], DATA_ASSETS)
    for asset in DATA_ASSETS:
        assert (
            Storage(str(alone)).require(asset, "v2").data_version
            == store.require(asset, "v2").data_version
        )
