"""Where new dataset versions land: a local folder or any fsspec URL, watched by the new-data
sensor.

A dataset version is one entry directly under the landing location:

- a sub-folder ``{key}/`` holding CSV / TSV / JSONL / Parquet files, complete once
  ``{key}/_SUCCESS`` exists (the marker Spark, Hadoop and most copy tools write last);
- a single file ``{key}.csv`` (or .tsv / .jsonl / .json / .parquet), complete once its size and
  modification time have not changed between two sensor ticks (no marker needed for a plain copy).

Entries whose name starts with ``.`` or ``_`` are in-progress uploads or bookkeeping and are
ignored. Delta tables listed in ``delta_tables`` are watched too: each new row-adding commit (or
each ``min_new_rows`` new rows) becomes a version ``{name}-v{table version}`` pinned to that
version. No Dagster logic beyond the resource itself: listing and fingerprinting are plain
functions, tested directly. Both read listings only, never file contents, so a sensor tick stays
cheap whatever the drops weigh.
"""

import hashlib
import os
from dataclasses import dataclass

import dagster as dg
import fsspec
from pydantic import Field

from finetune_assets.core.labels.infer import MANIFEST as LABELS_MANIFEST
from finetune_assets.core.sources import FORMATS, ignored_because

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
    # from the listing entry itself (size + mtime; a folder's own mtime where the store has one)
    signature: str


class WatchedDeltaTable(dg.Config):
    """A Delta table whose new commits become dataset versions ``{name}-v{table version}``."""

    name: str = Field(description="prefix of the version keys, e.g. reviews -> reviews-v12")
    table: str = Field(description="path or object-store URL of the Delta table")
    min_new_rows: int = Field(
        default=1,
        ge=1,
        description=(
            "a new version once this many rows were added since the last one (1: one per "
            "row-adding "
            "commit); commits that add no rows (optimize, vacuum) never count"
        ),
    )
    text_column: str | None = None
    label_column: str | None = None
    where: str | None = Field(
        default=None, description="row filter (SQL predicate), part of every version"
    )
    labels: list[str] | None = Field(
        default=None, description="class names in id order (default: Positive, Negative, Mixed)"
    )


class LandingZoneResource(dg.ConfigurableResource):
    """The landing location the sensor watches; default ``$FINETUNE_ASSETS_LANDING`` or
    ``./landing``.
    """

    url: str | None = Field(
        default=None,
        description=f"folder or fsspec URL (s3://bucket/landing); empty: ${LANDING_ENV} or "
        f"./{DEFAULT_LANDING}",
    )
    success_marker: str = Field(
        default=SUCCESS_MARKER, description="file that marks a version folder as completely written"
    )
    create_if_missing: bool = Field(
        default=True,
        description="create a local landing folder on first use, so a new user can drop files in",
    )
    tick_budget_s: float = Field(
        default=20.0,
        description="seconds of work per sensor tick (Dagster times a tick out at 60 s); entries "
        "left over are handled by the next tick, progress is kept in the cursor",
    )
    delta_tables: list[WatchedDeltaTable] = Field(
        default=[],
        description=(
            "Delta tables watched for new commits (delta-rs reads their commit history only)"
        ),
    )

    def location(self) -> str:
        """The resolved landing URL (local paths made absolute, so run logs show where to look)."""
        url = self.url or os.environ.get(LANDING_ENV) or DEFAULT_LANDING
        if "://" not in url:
            url = os.path.abspath(os.path.expanduser(url))
        return url.rstrip("/")

    def list_entries(self) -> list[LandedEntry]:
        """Every candidate version directly under the landing location, sorted by name.

        One listing call, nothing per entry: a tick over thousands of registered folders costs no
        more I/O than that listing. Per-folder work (marker, fingerprint) is done only for new
        entries.
        """
        url = self.location()
        fs, root = fsspec.core.url_to_fs(url)
        # object-store listings are cached per process; each tick must see new drops
        fs.invalidate_cache()
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
            is_dir = info["type"] == "directory"
            key = name if is_dir else strip_format_suffix(name) or name
            entries.append(
                LandedEntry(
                    name=name, key=key, uri=uri, is_dir=is_dir, signature=_signature([(name, info)])
                )
            )
        return entries

    def marker_present(self, entry: LandedEntry) -> bool:
        """Whether a folder is complete (its marker exists): one request, for unregistered
        folders only.
        """
        fs, path = fsspec.core.url_to_fs(entry.uri)
        return fs.exists(f"{path.rstrip('/')}/{self.success_marker}")


def strip_format_suffix(name: str) -> str | None:
    """``v3.csv`` -> ``v3``; None when the file type is not one the reader supports."""
    lowered = name.lower()
    for ext in sorted(FORMATS, key=len, reverse=True):
        if lowered.endswith(ext):
            return name[: -len(ext)]
    return None


def _files_under(fs, path: str) -> list[tuple[str, dict]]:
    found = fs.find(path, detail=True)
    return sorted((name[len(path) :].lstrip("/"), info) for name, info in found.items())


def _mtime(info: dict) -> str:
    value = (
        info.get("mtime")
        or info.get("LastModified")
        or info.get("last_modified")
        or info.get("updated")
        or info.get("created")
    )
    if hasattr(value, "timestamp"):
        return repr(value.timestamp())
    return repr(value)


def _signature(files: list[tuple[str, dict]]) -> str:
    digest = hashlib.sha256()
    for rel, info in files:
        etag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or ""
        digest.update(f"{rel}\x00{info.get('size')}\x00{_mtime(info)}\x00{etag}\x00".encode())
    return digest.hexdigest()[:16]


def fingerprint(uri: str, exclude: tuple[str, ...] = (SUCCESS_MARKER,)) -> str:
    """Fingerprint of a landed file or folder from its listing: relative names, sizes, mtimes /
    ETags.

    No file is read (a multi-GB drop costs one listing, not a full read inside the sensor tick); any
    rewrite changes size or mtime, so a re-landed drop gets a new fingerprint and run key. The
    content hash proper is ``raw_reviews``' data version, computed in the run.
    """
    fs, path = fsspec.core.url_to_fs(uri)
    if fs.isdir(path):
        files = [
            (rel, info)
            for rel, info in _files_under(fs, path.rstrip("/"))
            if rel not in exclude and (rel == LABELS_MANIFEST or ignored_because(rel) is None)
        ]
    else:
        files = [(path.rsplit("/", 1)[-1], fs.info(path))]
    return _signature(files)
