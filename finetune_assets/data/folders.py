"""The files under a local source folder, symlinks followed once: each real folder and file is read at most
once, and a link that loops back to a folder above it is named, never followed forever.

fsspec's local ``find`` does not follow symlinked folders (it lists the link itself, which then reads as an
"unsupported file type"); ``os.walk(followlinks=True)`` follows them but loops on a link to an ancestor.
"""

from __future__ import annotations

import os


def walk_local(root: str) -> tuple[list[str], dict[str, str]]:
    """(files, skipped path -> why): every file under ``root`` through symlinks, sorted; a second path to
    a folder or file already reached, a symlink loop and a dangling link are skipped with the reason."""
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
                    skipped[path] = f"symlink loop: {path} -> {real}, a folder above it (not followed)"
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
