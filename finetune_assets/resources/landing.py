"""Where new dataset versions land: a local folder or any fsspec URL, watched by the new-data sensor.

A dataset version is one entry directly under the landing location:

- a sub-folder ``{key}/`` holding CSV / TSV / JSONL / Parquet files, complete once ``{key}/_SUCCESS`` exists
  (the marker Spark, Hadoop and most copy tools write last);
- a single file ``{key}.csv`` (or .tsv / .jsonl / .json / .parquet), complete once its size and
  modification time have not changed between two sensor ticks (no marker needed for a plain copy).

Entries whose name starts with ``.`` or ``_`` are in-progress uploads or bookkeeping and are ignored.
No Dagster logic beyond the resource itself: listing and fingerprinting are plain functions, tested directly.
"""

import hashlib
import os
from dataclasses import dataclass
from typing import Optional

import dagster as dg
import fsspec
from pydantic import Field

from finetune_assets.data.labels import MANIFEST as LABELS_MANIFEST
from finetune_assets.data.sources import FORMATS

LANDING_ENV = "FINETUNE_ASSETS_LANDING"
DEFAULT_LANDING = "landing"
SUCCESS_MARKER = "_SUCCESS"


@dataclass(frozen=True)
class LandedEntry:
    """One candidate version as seen in a listing (cheap: no file contents read)."""

    name: str  # entry name under the landing location
    key: str  # proposed version key (folder name, or file name without its extension)
    uri: str  # fsspec URL (or local path) of the file or folder
    is_dir: bool
    signature: str  # sizes + modification times: changes whenever the content does
    marker_present: bool = False  # folders only


class LandingZoneResource(dg.ConfigurableResource):
    """The landing location the sensor watches; default ``$FINETUNE_ASSETS_LANDING`` or ``./landing``."""

    url: Optional[str] = Field(
        default=None,
        description=f"folder or fsspec URL (s3://bucket/landing); empty: ${LANDING_ENV} or ./{DEFAULT_LANDING}",
    )
    success_marker: str = Field(
        default=SUCCESS_MARKER, description="file that marks a version folder as completely written")
    create_if_missing: bool = Field(
        default=True, description="create a local landing folder on first use, so a new user can drop files in")

    def location(self) -> str:
        """The resolved landing URL (local paths made absolute, so run logs show where to look)."""
        url = self.url or os.environ.get(LANDING_ENV) or DEFAULT_LANDING
        if "://" not in url:
            url = os.path.abspath(os.path.expanduser(url))
        return url.rstrip("/")

    def list_entries(self) -> list[LandedEntry]:
        """Every candidate version directly under the landing location, sorted by name."""
        url = self.location()
        fs, root = fsspec.core.url_to_fs(url)
        fs.invalidate_cache()  # object-store listings are cached per process; each tick must see new drops
        if not fs.exists(root):
            if self.create_if_missing and "://" not in url:
                os.makedirs(root, exist_ok=True)
                return []
            raise FileNotFoundError(f"landing location {url} does not exist")
        protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
        entries = []
        for info in sorted(fs.ls(root, detail=True), key=lambda i: i["name"]):
            path = info["name"].rstrip("/")
            name = path.rsplit("/", 1)[-1]
            if not name or name.startswith((".", "_")):
                continue
            uri = protocol + path if protocol and "://" not in path else path
            if info["type"] == "directory":
                files = _files_under(fs, path)
                marker = any(rel == self.success_marker for rel, _ in files)
                entries.append(LandedEntry(name=name, key=name, uri=uri, is_dir=True,
                                           signature=_signature(files), marker_present=marker))
            else:
                entries.append(LandedEntry(name=name, key=strip_format_suffix(name) or name, uri=uri,
                                           is_dir=False, signature=_signature([(name, info)])))
        return entries


def strip_format_suffix(name: str) -> str | None:
    """``v3.csv`` -> ``v3``; None when the file type is not one the reader supports."""
    lowered = name.lower()
    for ext in sorted(FORMATS, key=len, reverse=True):
        if lowered.endswith(ext):
            return name[: -len(ext)]
    return None


def _files_under(fs, path: str) -> list[tuple[str, dict]]:
    found = fs.find(path, detail=True)
    return sorted((name[len(path):].lstrip("/"), info) for name, info in found.items())


def _mtime(info: dict) -> str:
    value = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or info.get("updated")
    if hasattr(value, "timestamp"):
        return repr(value.timestamp())
    return repr(value)


def _signature(files: list[tuple[str, dict]]) -> str:
    digest = hashlib.sha256()
    for rel, info in files:
        digest.update(f"{rel}\x00{info.get('size')}\x00{_mtime(info)}\x00".encode())
    return digest.hexdigest()[:16]


def fingerprint(uri: str, exclude: tuple[str, ...] = (SUCCESS_MARKER,)) -> str:
    """Content hash of a landed file or folder (relative names + bytes; markers and hidden files left out,
    the label manifest kept: other labels are other content).

    Part of every run key, so re-landing different content under a deleted key runs again.
    """
    fs, path = fsspec.core.url_to_fs(uri)
    digest = hashlib.sha256()
    if fs.isdir(path):
        files = [(rel, f"{path.rstrip('/')}/{rel}") for rel, _ in _files_under(fs, path.rstrip("/"))
                 if rel not in exclude
                 and (rel == LABELS_MANIFEST or not rel.rsplit("/", 1)[-1].startswith((".", "_")))]
    else:
        files = [(path.rsplit("/", 1)[-1], path)]
    for rel, full in files:
        digest.update(rel.encode() + b"\x00")
        with fs.open(full, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]
