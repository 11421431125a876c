"""The files under a storage root, and the project's only file primitives: the atomic rename
(:func:`rename_into_place`), the staged write that ends in it (:func:`staged_file`), the file lock
(:func:`file_lock`) and the JSON read (:func:`read_json`); plus the root setting, URL joins and the
content hash that is every asset's data version. Kept free of Dagster (pods and the CLI use it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

STORAGE_ROOT_ENV = "FINETUNE_ASSETS_ROOT"
DEFAULT_ROOT = ".finetune_assets"

ROOT_SETTING = (
    f"set the storage root to a folder this user can write: ${STORAGE_ROOT_ENV} (CLI --root, "
    "Dagster resource `storage` root)"
)


class StorageRootError(OSError):
    """The storage root cannot be written; the message names the setting that fixes it."""


def make_dirs(path: Path, root: str, exist_ok: bool = True) -> None:
    """``mkdir -p`` under the storage root; a failure (read-only or system path) names the root
    setting.
    """
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        raise
    except OSError as err:
        raise StorageRootError(
            f"storage root {root}: cannot create {path}: {err.strerror or err}; {ROOT_SETTING}"
        ) from err


def default_root() -> str:
    """``$FINETUNE_ASSETS_ROOT``, else ``./.finetune_assets``: one rule for Dagster, the CLI and
    scripts.
    """
    return os.environ.get(STORAGE_ROOT_ENV) or DEFAULT_ROOT


def rename_into_place(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """The one atomic rename: ``dst`` is the old or the new file (or folder), never a mix.

    ``os.replace`` is atomic only within one filesystem, so every caller stages beside ``dst``.
    """
    os.replace(src, dst)


@contextlib.contextmanager
def staged_file(
    url: str, scratch: str | None = None, before_commit: Callable[[], None] | None = None
) -> Iterator[Path]:
    """A local path to write ``url``'s content to; committed in one step when the block succeeds.

    Local: a hidden temp file beside the target (same filesystem), fsync, :func:`rename_into_place`.
    Remote: a temp file in ``scratch`` (default: the temp dir), then one upload (a single PUT is
    atomic on object stores). ``before_commit`` runs last before the commit and may refuse it by
    raising (a checkpoint's fence). On failure nothing appears at ``url``.
    """
    fs, path = fsspec.core.url_to_fs(url)
    local = isinstance(fs, LocalFileSystem)
    folder = Path(path).parent if local else Path(scratch or tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=str(folder), prefix=f".{Path(path).name}.")
    os.close(fd)
    try:
        yield Path(tmp)
        if before_commit is not None:
            before_commit()
        if local:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)  # the bytes are on disk before the name points at them
            finally:
                os.close(fd)
            rename_into_place(tmp, path)
        else:
            fs.put_file(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_bytes_atomic(url: str, body: bytes) -> None:
    """Replace one small file in a single step: readers see the old or the new bytes, never a mix
    (:func:`staged_file` locally; one PUT, without a temp file, on object stores).
    """
    fs, path = fsspec.core.url_to_fs(url)
    if not isinstance(fs, LocalFileSystem):
        fs.pipe(path, body)
        return
    with staged_file(url) as tmp:  # creates the folder
        tmp.write_bytes(body)


def read_json(url: str, fs: Any = None, missing: Any = FileNotFoundError) -> Any:
    """The JSON document at ``url`` (through ``fs`` when given); ``missing`` is returned when there
    is no file, unless it is left at raising ``FileNotFoundError``.
    """
    if fs is None:
        fs, url = fsspec.core.url_to_fs(url)
    try:
        with fs.open(url, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        if missing is FileNotFoundError:
            raise
        return missing


@contextlib.contextmanager
def file_lock(
    url: str | os.PathLike,
    fs: Any = None,
    timeout_s: float | None = None,
    stale_s: float = 120.0,
) -> Iterator[None]:
    """The one inter-process lock, on the file ``url`` (created); ``TimeoutError`` after
    ``timeout_s`` (None: wait as long as it takes).

    Local: ``fcntl.flock``, released by the kernel when the holder exits or dies, so a killed
    process never leaves it held (the file stays; it is only a name to lock). Object stores
    (``fs`` not local): an exclusively created lease file (``xb``, a conditional PUT where the
    filesystem has one; elsewhere a check-then-write, which narrows but does not close the race),
    deleted on exit and taken over once older than ``stale_s`` (left by a killed holder).
    """
    if fs is not None and not isinstance(fs, LocalFileSystem):
        with _lease_file(fs, str(url), timeout_s, stale_s):
            yield
        return
    import fcntl  # lazy: POSIX only, and only a local lock needs it

    Path(url).parent.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with open(url, "a") as f:
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} is held by another process") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def _lease_file(fs: Any, url: str, timeout_s: float | None, stale_s: float) -> Iterator[None]:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    body = f"{os.getpid()} {time.time()}\n".encode()
    while True:
        try:
            try:
                with fs.open(url, "xb") as f:
                    f.write(body)
            except (ValueError, NotImplementedError, TypeError):
                if fs.exists(url):
                    raise FileExistsError(url) from None
                fs.pipe(url, body)
            break
        except FileExistsError:
            if _lease_age(fs, url) > stale_s:
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(url)
                continue
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{url} is held by another process") from None
            time.sleep(0.05)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(url)


def _lease_age(fs: Any, url: str) -> float:
    try:
        with fs.open(url, "rb") as f:
            return time.time() - float(f.read().split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return 0.0


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


# Keys that name the library which wrote a file, not what it holds (an upgrade must not make data
# stale).
WRITER_KEYS = frozenset({"transformers_version"})


def hash_tree(path: Path, exclude: tuple[str, ...] = ()) -> str:
    """Content hash of a local file or folder (relative names + content), the asset's data version.

    Content, not writer metadata: Parquet and Arrow files are hashed by their table (schema +
    values, not the footer's ``created_by`` nor the compression), JSON files without ``WRITER_KEYS``
    such as the ``transformers_version`` that ``save_pretrained`` stamps into ``config.json``. So a
    library upgrade that rewrites the same data leaves data versions, and staleness, unchanged.
    Other files: their bytes.
    """
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for p in files:
        rel = p.name if p == path else p.relative_to(path).as_posix()
        if rel in exclude:
            continue
        digest.update(rel.encode() + b"\x00")
        _hash_content(p, digest)
    return digest.hexdigest()[:16]


def _hash_content(path: Path, digest) -> None:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".arrow"):
        table = _read_table(path)
        if table is not None:
            table = table.replace_schema_metadata(None).combine_chunks()
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            digest.update(b"table\x00" + sink.getvalue().to_pybytes())
            return
    if suffix == ".json":
        try:
            data = json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError):
            data = None
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k not in WRITER_KEYS}
            digest.update(b"json\x00" + json.dumps(data, sort_keys=True).encode())
            return
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)


def _read_table(path: Path):
    """The table in a Parquet or Arrow IPC file; None when it is not one (then its bytes are
    hashed).
    """
    try:
        if path.suffix.lower() == ".parquet":
            return pq.read_table(path)
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()
    except (pa.ArrowInvalid, OSError):
        return None
