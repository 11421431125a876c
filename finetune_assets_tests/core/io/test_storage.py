"""Storage root: atomic publish, CURRENT pointer, garbage collection, isolation, path safety,
fsspec roots.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from finetune_assets.core.io.storage import ATTEMPTS, POINTER, Storage, hash_tree, join
from finetune_assets.defs.versions.partitions import InvalidVersionKey


class Boom(RuntimeError):
    pass


def _publish(
    store: Storage, asset: str, partition: str | None, body: str, name: str = "data.txt"
) -> str:
    with store.publish(asset, partition) as staging:
        (staging.local_dir / name).write_text(body)
        staging.data_version = hash_tree(staging.local_dir)
        staging.metadata = {"body": body}
    return staging.attempt


def _read_current(store: Storage, asset: str, partition: str | None, name: str = "data.txt") -> str:
    published = store.require(asset, partition)
    with store.fs.open(join(published.url, name), "rb") as f:
        return f.read().decode()


def _put(store: Storage, url: str, body: bytes) -> None:
    store.fs.makedirs(url.rsplit("/", 1)[0], exist_ok=True)
    store.fs.pipe(url, body)


def _attempts(store: Storage, asset: str, partition: str | None) -> list[str]:
    path = join(store.prefix(asset, partition), ATTEMPTS)
    if not store.fs.exists(path):
        return []
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in store.fs.ls(path, detail=False))


@pytest.fixture(params=["local", "memory"])
def store(request, storage_root: Path) -> Storage:
    """The same tests over a local folder and an fsspec object-store-like root (the remote code
    path).
    """
    if request.param == "local":
        yield Storage(str(storage_root))
        return
    root = f"memory://finetune-assets-test-{uuid.uuid4().hex[:8]}/root"
    s = Storage(root)
    yield s
    if s.fs.exists(s.root):
        s.fs.rm(s.root, recursive=True)


def test_publish_makes_current_point_to_complete_data(store: Storage):
    assert store.current("raw_reviews", "v1") is None
    attempt = _publish(store, "raw_reviews", "v1", "one")
    published = store.require("raw_reviews", "v1")
    assert published.attempt == attempt
    assert published.metadata == {"body": "one"}
    assert published.data_version == hash_tree_of_text("one")
    assert _read_current(store, "raw_reviews", "v1") == "one"
    assert store.is_local == store.root.startswith("/")


def hash_tree_of_text(body: str) -> str:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "data.txt").write_text(body)
        return hash_tree(Path(d))


def test_exception_inside_publish_keeps_previous_version_and_removes_attempt(store: Storage):
    first = _publish(store, "raw_reviews", "v1", "complete")
    with pytest.raises(Boom):
        with store.publish("raw_reviews", "v1") as staging:
            (staging.local_dir / "data.txt").write_text("half-writ")
            staging.data_version = "never"
            raise Boom("killed mid-write")
    assert store.require("raw_reviews", "v1").attempt == first
    assert _read_current(store, "raw_reviews", "v1") == "complete"
    assert _attempts(store, "raw_reviews", "v1") == [first]


def test_failed_first_publish_leaves_nothing(store: Storage):
    with pytest.raises(Boom):
        with store.publish("tokenized_reviews", "v1") as staging:
            (staging.local_dir / "tokens.arrow").write_bytes(b"partial")
            raise Boom()
    assert store.current("tokenized_reviews", "v1") is None
    assert not store.fs.exists(join(store.prefix("tokenized_reviews", "v1"), POINTER))
    assert _attempts(store, "tokenized_reviews", "v1") == []


def test_publish_without_data_version_is_refused_and_cleaned_up(store: Storage):
    with pytest.raises(RuntimeError, match="data_version"):
        with store.publish("raw_reviews", "v1") as staging:
            (staging.local_dir / "data.txt").write_text("x")
    assert store.current("raw_reviews", "v1") is None
    assert _attempts(store, "raw_reviews", "v1") == []


def test_publish_keeps_the_replaced_version_and_collects_the_one_before(store: Storage):
    """A reader still streaming the version just replaced keeps its files until the next publish."""
    first = _publish(store, "raw_reviews", "v1", "a")
    second = _publish(store, "raw_reviews", "v1", "b")
    assert first != second
    assert _attempts(store, "raw_reviews", "v1") == sorted([first, second])
    assert store.current("raw_reviews", "v1").previous == first
    third = _publish(store, "raw_reviews", "v1", "c")
    assert _attempts(store, "raw_reviews", "v1") == sorted([second, third])
    assert _read_current(store, "raw_reviews", "v1") == "c"


def test_young_foreign_attempt_survives_garbage_collection(store: Storage):
    """An attempt that may belong to a concurrent writer of the same partition is not deleted."""
    first = _publish(store, "raw_reviews", "v1", "a")
    fresh = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-concurrent"
    _put(
        store, join(store.prefix("raw_reviews", "v1"), ATTEMPTS, fresh, "part.bin"), b"in progress"
    )
    latest = _publish(store, "raw_reviews", "v1", "b")
    assert _attempts(store, "raw_reviews", "v1") == sorted([first, fresh, latest])


def test_abandoned_old_attempt_is_collected(store: Storage):
    first = _publish(store, "raw_reviews", "v1", "a")
    stale = "20000101T000000-killedrun"
    stale_file = join(store.prefix("raw_reviews", "v1"), ATTEMPTS, stale, "part.bin")
    _put(store, stale_file, b"left by a SIGKILLed run")
    if store.is_local:  # a killed run long ago: old mtime too
        old = time.time() - 10 * 3600
        os.utime(Path(stale_file).parent, (old, old))
    latest = _publish(store, "raw_reviews", "v1", "b")
    assert _attempts(store, "raw_reviews", "v1") == sorted([first, latest])


def test_two_partitions_never_share_files(store: Storage):
    _publish(store, "raw_reviews", "v1", "one")
    _publish(store, "raw_reviews", "v2", "two")
    _publish(store, "raw_reviews", "v1", "one again")
    p1, p2 = store.require("raw_reviews", "v1"), store.require("raw_reviews", "v2")
    assert not p1.url.startswith(store.prefix("raw_reviews", "v2"))
    assert not p2.url.startswith(store.prefix("raw_reviews", "v1"))
    files_1 = set(store.fs.find(store.prefix("raw_reviews", "v1")))
    files_2 = set(store.fs.find(store.prefix("raw_reviews", "v2")))
    assert files_1 and files_2 and not files_1 & files_2
    assert _read_current(store, "raw_reviews", "v2") == "two"  # untouched by v1's republish
    assert _read_current(store, "raw_reviews", "v1") == "one again"


def test_unpartitioned_asset_has_its_own_prefix(store: Storage):
    _publish(store, "pretrained_model", None, "weights")
    assert store.require("pretrained_model").url.startswith(
        join(store.root, "pretrained_model", "_")
    )


@pytest.mark.parametrize(
    "key", ["../escape", "a/b", "..", "v 1", "", "/abs", "v1/../../etc", "a" * 64, "-v1"]
)
def test_partition_keys_that_escape_or_are_unsafe_are_rejected(store: Storage, key: str):
    with pytest.raises(InvalidVersionKey, match="invalid dataset version key"):
        with store.publish("raw_reviews", key):
            pass
    with pytest.raises(InvalidVersionKey):
        store.current("raw_reviews", key)
    assert not store.fs.exists(store.root) or all(
        f.startswith(store.fs._strip_protocol(store.root)) for f in store.fs.find(store.root)
    )


@pytest.mark.parametrize("parts", [("..", "x"), ("versions", "../../etc/passwd"), ("a/../../b",)])
def test_url_rejects_path_escapes(store: Storage, parts):
    with pytest.raises(ValueError, match="escapes the storage root"):
        store.url(*parts)


@pytest.mark.parametrize("asset", ["../raw", "raw/reviews", "raw reviews", ""])
def test_invalid_asset_names_are_rejected(store: Storage, asset: str):
    with pytest.raises(ValueError, match="invalid asset name"):
        store.prefix(asset, "v1")


def test_write_atomic_and_read_json(store: Storage):
    url = store.url("versions", "v1.json")
    assert store.read_json(url) is None
    store.write_atomic(url, json.dumps({"a": 1}).encode())
    store.write_atomic(url, json.dumps({"a": 2}).encode())
    assert store.read_json(url) == {"a": 2}
    if store.is_local:  # no temporary files left beside it
        assert sorted(p.name for p in Path(url).parent.iterdir()) == ["v1.json"]


def test_local_copy_gives_the_published_folder(store: Storage):
    with store.publish("mds_shards", "v1") as staging:
        (staging.local_dir / "train").mkdir()
        (staging.local_dir / "train" / "index.json").write_text("{}")
        (staging.local_dir / "top.bin").write_bytes(b"\x00\x01")
        staging.data_version = hash_tree(staging.local_dir)
    published = store.require("mds_shards", "v1")
    with store.local_copy(published.url) as local:
        assert (local / "train" / "index.json").read_text() == "{}"
        assert (local / "top.bin").read_bytes() == b"\x00\x01"
        assert hash_tree(local) == published.data_version


def test_require_names_the_missing_asset(store: Storage):
    with pytest.raises(
        FileNotFoundError, match=r"tokenized_reviews\[v9\] has not been materialized"
    ):
        store.require("tokenized_reviews", "v9")


def test_hash_tree_depends_on_names_and_bytes(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("1")
    (b / "x").write_text("1")
    assert hash_tree(a) == hash_tree(b)
    (b / "x").write_text("2")
    assert hash_tree(a) != hash_tree(b)
    (b / "x").write_text("1")
    (b / "y").write_text("")
    assert hash_tree(a) != hash_tree(b)
    assert hash_tree(b, exclude=("y",)) == hash_tree(a)


# -- concurrency: conditional pointer update, leases, pins -----------------------------------


def test_concurrent_publishes_of_one_partition_chain_previous_and_keep_both(
    storage_root: Path, monkeypatch
):
    """Barrier between the pointer read and write: without a critical section both publishes read
    the same previous, one attempt drops out of the chain and is collected while Dagster's record
    names it.
    """
    import threading

    store = Storage(str(storage_root))
    first = _publish(store, "tokenized_reviews", "v1", "base")
    reads = []
    second_read = threading.Event()
    real_current, real_write = Storage.current, Storage._write_pointer

    def current(self, asset, partition=None):
        result = real_current(self, asset, partition)
        reads.append(result.attempt if result else None)
        if len(reads) >= 2:
            second_read.set()
        return result

    def write_pointer(self, prefix, pointer):
        second_read.wait(timeout=1.0)  # hold the first writer between its read and its write
        real_write(self, prefix, pointer)

    monkeypatch.setattr(Storage, "current", current)
    monkeypatch.setattr(Storage, "_write_pointer", write_pointer)
    done: list[str] = []
    threads = [
        threading.Thread(
            target=lambda b=b: done.append(
                _publish(Storage(str(storage_root)), "tokenized_reviews", "v1", b)
            )
        )
        for b in ("a", "b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(Storage, "current", real_current)
    last = store.require("tokenized_reviews", "v1")
    assert last.attempt == done[-1] and last.previous == done[0]  # no lost update
    assert set(done) <= set(_attempts(store, "tokenized_reviews", "v1")) and first not in done


def test_a_run_keeps_its_base_model_while_another_publishes(store: Storage):
    """A base-model publish during another run changes neither that run's files nor deletes them."""
    used = _publish(store, "pretrained_model", None, "tokenizer A")
    assert store.pinned("pretrained_model", "run-1").attempt == used  # tokenize step
    # enough publishes to retire the first
    for body in (
        "tokenizer B",
        "tokenizer C",
        "tokenizer D",
    ):
        _publish(store, "pretrained_model", None, body)
    pinned = store.pinned("pretrained_model", "run-1")  # train step of the same run
    assert pinned.attempt == used and pinned.data_version == hash_tree_of(store, pinned.url)
    with store.fs.open(join(pinned.url, "data.txt"), "rb") as f:
        assert f.read() == b"tokenizer A"
    assert store.pinned("pretrained_model", "run-2").attempt != used  # a new run starts on CURRENT
    assert _read_current(store, "pretrained_model", None) == "tokenizer D"


def hash_tree_of(store: Storage, url: str) -> str:
    with store.local_copy(url) as local:
        return hash_tree(local)


def test_an_old_attempt_still_being_written_is_not_collected(store: Storage):
    """GC treats attempts older than an hour as abandoned, unless the writer's heartbeat lease is
    alive.
    """
    prefix = store.prefix("finetuned_model", "v1")
    old = "20000101T000000-deadbeef"  # started long ago: a long training, still writing
    _put(store, join(prefix, ATTEMPTS, old, "partial.bin"), b"x")
    with store._heartbeat(prefix, f"writer-{old}", old):
        _publish(store, "finetuned_model", "v1", "other run")
        _publish(store, "finetuned_model", "v1", "another run")
        assert old in _attempts(store, "finetuned_model", "v1")
        assert store.leased(prefix) == {old}
    assert store.leased(prefix) == set()  # writer gone: the attempt is collectable again (by age)
