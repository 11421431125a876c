"""The files under a storage root: the root setting, atomic single-file writes, URL joins, and the
content hash that is every asset's data version. Kept free of Dagster (pods and the CLI use it).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import fsspec
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


def write_bytes_atomic(url: str, body: bytes) -> None:
    """Replace one small file in a single step: readers see the old or the new bytes, never a mix.

    Local: a temp file in the same folder, fsync, ``os.replace``. Remote: one PUT (atomic on object
    stores).
    """
    fs, path = fsspec.core.url_to_fs(url)
    if not isinstance(fs, LocalFileSystem):
        fs.pipe(path, body)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=str(target.parent), prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
    import hashlib

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
            import pyarrow as pa

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
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix.lower() == ".parquet":
            return pq.read_table(path)
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()
    except (pa.ArrowInvalid, OSError):
        return None
