"""Which files of a file or folder source are data: formats by suffix, ignore rules, archives
refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import fsspec

from finetune_assets.core.sources.base import SourceError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
# single-file streams, decompressed as read
COMPRESSIONS = {
    ".gz": "gzip",
    ".bz2": "bz2",
    ".xz": "xz",
    ".zst": "zstd",
}
# refused: unpack them into the folder
ARCHIVES = (
    ".zip",
    ".tar",
    ".tgz",
    ".tar.gz",
    ".7z",
    ".rar",
)

# Names in a source folder that are never data (documented in docs/reliability.md "Folder sources"):
# hidden files and folders (".*": .DS_Store, ._* AppleDouble files, .ipynb_checkpoints/, .git/ ...),
# OS metadata, completion markers, and documentation beside the data.
IGNORED_DIRS = ("__MACOSX",)
# _labels.json: a drop's label set
IGNORED_FILES = (
    "Thumbs.db",
    "desktop.ini",
    "_SUCCESS",
    "_labels.json",
)
DOC_SUFFIXES = (".md", ".txt", ".rst", ".pdf")
DOC_PREFIXES = ("readme", "license", "notice")


@dataclass(frozen=True)
class Listing:
    """The files of a source: what is read, and what was left out and why (shown in metadata)."""

    files: list[str]
    ignored: dict[str, str]  # path -> why it is not read


def list_files(uri: str) -> list[str]:
    """The data files of a source: the file itself, or every data file under a folder (sorted)."""
    return list_source(uri).files


def list_source(uri: str) -> Listing:
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.exists(path):
        raise SourceError(
            f"{uri}: no such file or folder (check the source path: `versions add --source` "
            "or raw_reviews config `source`)"
        )
    if not fs.isdir(path):
        format_or_raise(uri)
        return Listing([uri], {})
    protocol = uri.split("://", 1)[0] + "://" if "://" in uri else ""
    base = path.rstrip("/")
    files, ignored = [], {}
    if protocol in ("", "file://"):  # local: symlinked folders followed once (walk_local)
        found, ignored = walk_local(path)
    else:
        found = sorted(fs.find(path))
    for p in found:
        full = protocol + p if protocol and "://" not in p else p
        why = ignored_because(p[len(base) :].lstrip("/"))
        if why:
            ignored[full] = why
            continue
        format_or_raise(full, in_folder=uri)
        files.append(full)
    if not files:
        raise SourceError(
            f"{uri}: folder holds no data files ({', '.join(_supported())})"
            + (f"; ignored: {', '.join(sorted(ignored))}" if ignored else "")
        )
    return Listing(files, ignored)


def walk_local(root: str) -> tuple[list[str], dict[str, str]]:
    """(files, skipped path -> why): every file under ``root`` through symlinks, sorted; a second
    path to a folder or file already reached, a symlink loop and a dangling link are skipped with
    the reason.
    """
    files: dict[str, str] = {}  # real path -> first path reached
    skipped: dict[str, str] = {}
    seen_dirs = {os.path.realpath(root): root}

    def visit(folder: str, ancestors: tuple[str, ...]) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as err:
            skipped[folder] = f"cannot list: {err.strerror or err}"
            return
        for entry in entries:
            path = entry.path
            real = os.path.realpath(path)
            if entry.is_symlink() and not os.path.exists(path):
                skipped[path] = f"dangling symlink to {os.readlink(path)}"
            elif entry.is_dir(follow_symlinks=True):
                if real in ancestors:
                    skipped[path] = (
                        f"symlink loop: {path} -> {real}, a folder above it (not followed)"
                    )
                elif real in seen_dirs:
                    skipped[path] = f"same folder as {seen_dirs[real]} (symlink; read once)"
                else:
                    seen_dirs[real] = path
                    visit(path, (*ancestors, real))
            elif real in files:
                skipped[path] = f"same file as {files[real]} (symlink; read once)"
            else:
                files[real] = path

    visit(root, (os.path.realpath(root),))
    return sorted(files.values()), skipped


def ignored_because(rel: str) -> str | None:
    """Why a file at ``rel`` (relative to a source folder) is not data, or None (shared with the
    sensor).
    """
    parts = rel.split("/")
    name = parts[-1]
    if any(p.startswith(".") for p in parts[:-1]):
        return "inside a hidden folder"
    if any(p in IGNORED_DIRS for p in parts[:-1]):
        return "OS metadata folder"
    if name.startswith("."):
        return "hidden file"
    if name in IGNORED_FILES:
        return "OS metadata or completion marker"
    lowered = name.lower()
    if lowered.endswith(DOC_SUFFIXES) or lowered.startswith(DOC_PREFIXES):
        return "documentation, not data"
    return None


def _supported() -> list[str]:
    return sorted(FORMATS) + [f"{e}{c}" for e in (".csv", ".tsv", ".jsonl") for c in COMPRESSIONS]


def split_suffix(path: str) -> tuple[str | None, str | None]:
    """(format, compression) from the file name: ``a.csv.gz`` -> ("csv", "gzip")."""
    lowered = path.lower()
    compression = None
    for ext, codec in COMPRESSIONS.items():
        if lowered.endswith(ext):
            lowered, compression = lowered[: -len(ext)], codec
            break
    for ext, fmt in FORMATS.items():
        if lowered.endswith(ext):
            return fmt, compression
    return None, compression


def file_format(path: str) -> str | None:
    """csv / tsv / jsonl / parquet from the file name (compression suffixes looked through), else
    None.
    """
    return split_suffix(path)[0]


def format_or_raise(path: str, in_folder: str | None = None) -> str:
    fmt = file_format(path)
    if fmt is not None:
        return fmt
    where = f" in source folder {in_folder}" if in_folder else ""
    if path.lower().endswith(ARCHIVES):
        raise SourceError(
            f"{path}: archives are not read{where}; unpack it into the folder "
            "(compressed single files .gz/.bz2/.xz/.zst are read directly)"
        )
    raise SourceError(
        f"{path}: unsupported file type{where} (expected one of {', '.join(_supported())}); "
        "convert it, or move it out of the source"
    )
