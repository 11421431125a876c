"""Atomic, versioned publishing of asset outputs under one storage root (a local folder or any
fsspec URL).

Layout per asset and partition::

    {root}/{asset}/{partition}/attempts/{attempt_id}/...   # written by one materialization
    {root}/{asset}/{partition}/CURRENT                     # JSON pointer to the published attempt

A materialization writes a fresh attempt directory and only then replaces ``CURRENT`` in one
atomic step (``os.replace`` locally, a single-object PUT on object stores). Readers only follow
``CURRENT``, so a killed write leaves the previous version (or nothing) visible, never a partial
one, and two partitions never share a directory. Kept free of Dagster: pods and the CLI use it too.

Concurrency: the pointer's read-compare-write runs under a lock (local roots), so concurrent
publishes of one partition chain ``previous`` exactly and never delete each other's attempts; on
object stores, where fsspec offers no portable conditional PUT, one run per partition (tag
concurrency limit) is the guard. Attempts in use are leased (``leases/``): a writer's lease is
refreshed by a heartbeat, a run's pin by each of its steps, and garbage collection never removes a
leased attempt.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

# re-exported: callers import them from here
from finetune_assets.core.io.primitives import (  # noqa: F401
    DEFAULT_ROOT,
    ROOT_SETTING,
    STORAGE_ROOT_ENV,
    WRITER_KEYS,
    StorageRootError,
    default_root,
    file_lock,
    hash_tree,
    join,
    make_dirs,
    read_json,
    write_bytes_atomic,
)
from finetune_assets.core.versions.keys import validate_version_key

UNPARTITIONED = "_"
POINTER = "CURRENT"
ATTEMPTS = "attempts"
LOCKS = ".locks"
# {prefix}/records/{attempt}.json: the pointer as it was when that attempt was published
RECORDS = "records"
LEASES = (
    "leases"  # {prefix}/leases/{holder}.json: an attempt in use (being written, or read by a run)
)
LEASE_TTL_S = (
    600.0  # a writer's lease, refreshed every TTL/3 while it writes; a killed writer's expires
)
PIN_TTL_S = 24 * 3600.0  # a run's pin (lease) on what it read, refreshed by each of its steps
# Abandoned attempts (killed runs) older than this are removed by the next successful publish;
# younger ones may belong to a concurrent materialization of the same partition.
ABANDONED_AFTER_S = 3600.0
ATTEMPT_TIME = "%Y%m%dT%H%M%S"  # UTC start time, the first part of an attempt id


@dataclass(frozen=True)
class Published:
    """What ``CURRENT`` points at."""

    url: str
    attempt: str
    data_version: str
    metadata: dict[str, Any]
    previous: str | None = None  # the attempt this one replaced, kept until the next publish

    @classmethod
    def from_record(cls, prefix: str, record: dict[str, Any]) -> Published:
        """The version a pointer (``CURRENT``, or the record kept of a publish) describes."""
        return cls(
            url=join(prefix, ATTEMPTS, record["attempt"]),
            attempt=record["attempt"],
            data_version=record["data_version"],
            metadata=record.get("metadata", {}),
            previous=record.get("previous"),
        )


class Staging:
    """A place to write one attempt; ``local_dir`` is always a local folder."""

    def __init__(self, local_dir: Path, url: str, attempt: str):
        self.local_dir = local_dir
        self.url = url
        self.attempt = attempt
        self.data_version: str | None = None
        self.metadata: dict[str, Any] = {}


class Storage:
    """The storage root: resolves asset paths, publishes atomically, reads published versions."""

    def __init__(self, root: str):
        if "://" not in root:
            root = str(Path(root).expanduser().resolve())
        self.root = root.rstrip("/")
        self.fs, self._fs_root = fsspec.core.url_to_fs(self.root)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def prefix(self, asset: str, partition: str | None = None) -> str:
        part = UNPARTITIONED if partition is None else validate_version_key(partition)
        if not asset.replace("_", "").isalnum():
            raise ValueError(f"invalid asset name {asset!r}")
        return join(self.root, asset, part)

    def url(self, *parts: str) -> str:
        for p in parts:
            if ".." in p.split("/"):
                raise ValueError(f"path {p!r} escapes the storage root")
        return join(self.root, *parts)

    # -- publishing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def publish(self, asset: str, partition: str | None = None) -> Iterator[Staging]:
        """Yield a staging area; publish it atomically only if the block succeeds.

        Set ``staging.data_version`` (content hash) and optionally ``staging.metadata`` inside the
        block.
        """
        prefix = self.prefix(asset, partition)
        attempt = f"{time.strftime(ATTEMPT_TIME, time.gmtime())}-{uuid.uuid4().hex[:8]}"
        url = join(prefix, ATTEMPTS, attempt)
        if self.is_local:
            local_dir = Path(url)
            make_dirs(local_dir, self.root, exist_ok=False)
            tmp = None
        else:
            tmp = tempfile.mkdtemp(prefix=f"{asset}-")
            local_dir = Path(tmp)
        staging = Staging(local_dir, url, attempt)
        try:
            with self._heartbeat(prefix, f"writer-{attempt}", attempt):
                yield staging
                if staging.data_version is None:
                    raise RuntimeError("publish(): the writer did not set staging.data_version")
                if not self.is_local:
                    self.fs.put(str(local_dir) + "/", url + "/", recursive=True)
                with self.lock(_pointer_lock(asset, partition)):
                    # Read inside the critical section: a publish that finished meanwhile becomes
                    # ``previous``.
                    previous = self.current(asset, partition)
                    record = {
                        "attempt": attempt,
                        "previous": previous.attempt if previous else None,
                        "data_version": staging.data_version,
                        "metadata": staging.metadata,
                        "published_at": time.time(),
                    }
                    self.write_atomic(
                        join(prefix, RECORDS, f"{attempt}.json"),
                        json.dumps(record, indent=2, sort_keys=True).encode(),
                    )
                    self._write_pointer(prefix, record)
        except BaseException:
            self._remove(url)
            raise
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        # the new version is published; cleanup can wait for the next one
        with contextlib.suppress(OSError):
            self._collect_garbage(
                prefix,
                keep={attempt, previous.attempt} if previous else {attempt},
                retired=previous.previous if previous else None,
            )

    # -- leases: attempts in use are never collected --------------------------------------------

    def _lease_url(self, prefix: str, holder: str) -> str:
        return join(prefix, LEASES, f"{holder}.json")

    def _write_lease(self, prefix: str, holder: str, attempt: str, ttl_s: float) -> None:
        self.write_atomic(
            self._lease_url(prefix, holder),
            json.dumps({"attempt": attempt, "expires": time.time() + ttl_s}).encode(),
        )

    @contextlib.contextmanager
    def _heartbeat(
        self, prefix: str, holder: str, attempt: str, ttl_s: float = LEASE_TTL_S
    ) -> Iterator[None]:
        """Lease ``attempt`` while the block runs, refreshed every ``ttl_s / 3`` by a daemon
        thread.
        """
        self._write_lease(prefix, holder, attempt, ttl_s)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(ttl_s / 3):
                with contextlib.suppress(OSError):
                    self._write_lease(prefix, holder, attempt, ttl_s)

        thread = threading.Thread(target=beat, name=f"lease-{holder}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self._remove(self._lease_url(prefix, holder))

    def leased(self, prefix: str) -> set[str]:
        """Attempts under ``prefix`` with an unexpired lease (expired lease files are removed)."""
        folder = join(prefix, LEASES)
        if not self.fs.exists(folder):
            return set()
        alive, now = set(), time.time()
        for path in self.fs.ls(folder, detail=False):
            lease = self.read_json(path)
            if lease is None:
                continue
            if float(lease.get("expires", 0)) > now:
                alive.add(lease["attempt"])
            else:
                self._remove(path)
        return alive

    def pinned(self, asset: str, run_id: str, partition: str | None = None) -> Published:
        """What ``asset`` looked like when run ``run_id`` first read it, leased for that run.

        Every step of a run reads the same attempt (a publish of a new base model between tokenizing
        and training does not mix tokenizers), and that attempt is not collected while the run goes
        on: each call renews the pin for ``PIN_TTL_S``.
        """
        prefix = self.prefix(asset, partition)
        holder = "run-" + "".join(c for c in run_id if c.isalnum() or c == "-")[:64]
        pin = self.read_json(self._lease_url(prefix, holder))
        current = self.current(asset, partition) if pin is None else None
        if pin is None and current is None:
            return self.require(asset, partition)  # raises: never materialized
        attempt = pin["attempt"] if pin is not None else current.attempt
        self._write_lease(prefix, holder, attempt, PIN_TTL_S)
        if current is not None and current.attempt == attempt:
            return current
        record = self.read_json(join(prefix, RECORDS, f"{attempt}.json"))
        if record is None:
            raise FileNotFoundError(
                f"{asset} attempt {attempt} pinned by run {run_id} has been removed"
            )
        return Published.from_record(prefix, record)

    def restore(self, asset: str, attempt: str, partition: str | None = None) -> Published:
        """Point ``CURRENT`` back at an earlier published ``attempt`` (its record must still exist).

        For a pointer that moved while the record of that publish was lost (the run was killed after
        the flip): the caller decides from its own record (Dagster's) which attempt is the truth.
        """
        prefix = self.prefix(asset, partition)
        with self.lock(_pointer_lock(asset, partition)):
            record = self.read_json(join(prefix, RECORDS, f"{attempt}.json"))
            if record is None or not self.fs.exists(join(prefix, ATTEMPTS, attempt)):
                raise FileNotFoundError(
                    f"{asset} attempt {attempt} has been removed: nothing to restore"
                )
            self._write_pointer(prefix, record)
        return self.require(asset, partition)

    def history(self, asset: str, partition: str | None = None, depth: int = 8) -> list[Published]:
        """``CURRENT`` and the attempts it replaced, newest first, as far as their records
        remain.
        """
        prefix = self.prefix(asset, partition)
        out, published = [], self.current(asset, partition)
        while published is not None and len(out) < depth:
            out.append(published)
            record = (
                self.read_json(join(prefix, RECORDS, f"{published.previous}.json"))
                if published.previous
                else None
            )
            published = None if record is None else Published.from_record(prefix, record)
        return out

    def _write_pointer(self, prefix: str, pointer: dict[str, Any]) -> None:
        self.write_atomic(
            join(prefix, POINTER), json.dumps(pointer, indent=2, sort_keys=True).encode()
        )

    def write_atomic(self, url: str, body: bytes) -> None:
        write_bytes_atomic(url, body)

    def read_json(self, url: str) -> Any | None:
        """The JSON document at ``url`` under this root, None when there is none."""
        return read_json(url, fs=self.fs, missing=None)

    def _remove(self, url: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self.fs.exists(url):
                self.fs.rm(url, recursive=True)

    def _collect_garbage(self, prefix: str, keep: set[str], retired: str | None) -> None:
        """Keep the new version and the one it replaced (a reader may still be streaming it); remove
        the version before that and attempts abandoned long ago by killed runs, unless an attempt is
        leased (being written, or pinned by a live run).
        """
        attempts = join(prefix, ATTEMPTS)
        now = time.time()
        leased = self.leased(prefix)
        for entry in self.fs.ls(attempts, detail=True):
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if name in keep or name in leased:
                continue
            if name == retired or _age_s(name, entry, now) > ABANDONED_AFTER_S:
                self._remove(join(attempts, name))
                self._remove(join(prefix, RECORDS, f"{name}.json"))

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Mutual exclusion between processes sharing this local root (``fcntl.flock``, released on
        exit or death).

        Object stores have no lock: there a Dagster pool / tag concurrency limit serializes the
        writers (docs/reliability.md, "Production semantics").
        """
        if not self.is_local:
            yield
            return
        path = Path(self.url(LOCKS, f"{name}.lock"))
        make_dirs(path.parent, self.root)
        with file_lock(path):
            yield

    # -- reading ----------------------------------------------------------------------------

    def current(self, asset: str, partition: str | None = None) -> Published | None:
        """The published version of an asset partition, or None if nothing was ever published."""
        prefix = self.prefix(asset, partition)
        pointer = self.read_json(join(prefix, POINTER))
        return None if pointer is None else Published.from_record(prefix, pointer)

    def require(self, asset: str, partition: str | None = None) -> Published:
        published = self.current(asset, partition)
        if published is None:
            where = f"{asset}[{partition}]" if partition else asset
            raise FileNotFoundError(
                f"{where} has not been materialized under {self.root}: materialize it first"
            )
        return published

    @contextlib.contextmanager
    def local_copy(self, url: str) -> Iterator[Path]:
        """A local folder with the contents of ``url`` (the folder itself when storage is local)."""
        if self.is_local:
            yield Path(url)
            return
        with tempfile.TemporaryDirectory() as tmp:
            self.fs.get(url + "/", tmp + "/", recursive=True)
            yield Path(tmp)


def _age_s(attempt: str, entry: dict[str, Any], now: float) -> float:
    """Seconds since an attempt started or last changed (the younger of both); 0 when unknown.

    Object stores list "directories" without a modification time, so the start time encoded in the
    attempt id is what makes an attempt old; unknown means young, so a concurrent writer of the
    same partition never loses its attempt.
    """
    ages = []
    with contextlib.suppress(ValueError):
        started = calendar.timegm(time.strptime(attempt.split("-", 1)[0], ATTEMPT_TIME))
        ages.append(now - started)
    mtime = entry.get("mtime") or entry.get("LastModified") or entry.get("created")
    if mtime is not None:
        ages.append(now - (mtime.timestamp() if hasattr(mtime, "timestamp") else float(mtime)))
    return min(ages) if ages else 0.0


def _pointer_lock(asset: str, partition: str | None) -> str:
    """The lock serializing every move of one partition's ``CURRENT``."""
    return f"pointer-{asset}-{partition or UNPARTITIONED}"
