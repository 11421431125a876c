"""The file primitives every writer goes through (``storage_files``): one atomic rename, one staged
write, one lock, one JSON read; and the rule that no other module renames into place or locks.
"""

from __future__ import annotations

import ast
import multiprocessing
import time
from pathlib import Path

import pytest

import finetune_assets
from finetune_assets.core.io.primitives import file_lock, read_json, staged_file, write_bytes_atomic

PACKAGE = Path(finetune_assets.__file__).parent  # the whole package is scanned
RENAMES = {("os", "replace"), ("os", "rename"), ("shutil", "move")}
LOCKS = {("fcntl", "flock"), ("fcntl", "lockf")}


def _calls(tree: ast.AST, wanted: set[tuple[str, str]]) -> list[tuple[str, int]]:
    """(enclosing function, line) of each call ``mod.attr(...)`` in ``wanted``."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = (
                child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            )
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and isinstance(child.func.value, ast.Name)
                and (child.func.value.id, child.func.attr) in wanted
            ):
                found.append((name, child.lineno))
            visit(child, name)

    visit(tree, "<module>")
    return found


def _package_calls(wanted: set[tuple[str, str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for func, _ in _calls(ast.parse(path.read_text()), wanted):
            out.setdefault(rel, set()).add(func)
    return out


def test_one_function_renames_into_place_and_one_takes_file_locks():
    # ``shutil.move`` is allowed only where a folder crosses filesystems (not atomic, said there)
    renames = _package_calls({("os", "replace"), ("os", "rename")})
    assert renames == {"finetune_assets/core/io/primitives.py": {"rename_into_place"}}
    assert _package_calls(LOCKS) == {"finetune_assets/core/io/primitives.py": {"file_lock"}}


def test_the_ast_scan_sees_a_rename_where_it_is():
    src = "import os\ndef publish(a, b):\n    os.replace(a, b)\n"
    assert _calls(ast.parse(src), RENAMES) == [("publish", 3)]


def test_a_staged_file_appears_whole_or_not_at_all(tmp_path: Path):
    target = tmp_path / "sub" / "part.arrow"
    with staged_file(str(target)) as tmp:
        tmp.write_bytes(b"v1")
        assert not target.exists()  # nothing visible before the block ends
    assert target.read_bytes() == b"v1"
    with pytest.raises(RuntimeError), staged_file(str(target)) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer died")
    assert target.read_bytes() == b"v1"
    assert [p.name for p in target.parent.iterdir()] == ["part.arrow"]  # no temp file left


def test_a_refused_commit_keeps_the_old_file(tmp_path: Path):
    target = tmp_path / "last.ckpt"
    write_bytes_atomic(str(target), b"old")

    def refuse() -> None:
        raise PermissionError("fenced off")

    with pytest.raises(PermissionError), staged_file(str(target), before_commit=refuse) as tmp:
        tmp.write_bytes(b"stale")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_remote_staged_file_is_uploaded_once_from_scratch(tmp_path: Path):
    import fsspec

    mem = fsspec.filesystem("memory")
    with staged_file("memory://bucket/x.json", scratch=str(tmp_path)) as tmp:
        assert tmp.parent == tmp_path
        tmp.write_bytes(b"{}")
        assert not mem.exists("/bucket/x.json")
    assert mem.cat("/bucket/x.json") == b"{}"
    assert list(tmp_path.iterdir()) == []


def test_read_json_missing_raises_unless_told(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        read_json(str(tmp_path / "none.json"))
    assert read_json(str(tmp_path / "none.json"), missing=None) is None
    write_bytes_atomic(str(tmp_path / "a.json"), b'{"k": 1}')
    assert read_json(str(tmp_path / "a.json")) == {"k": 1}


def _hold(path: str, ready, seconds: float) -> None:
    with file_lock(path):
        ready.set()
        time.sleep(seconds)
        Path(path + ".done").touch()  # the last thing done under the lock


def test_file_lock_excludes_another_process_until_it_ends(tmp_path: Path):
    path = str(tmp_path / "locks" / "x.lock")
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, ready, 1.0))
    holder.start()
    assert ready.wait(60)
    with file_lock(path):
        assert Path(path + ".done").exists()  # granted only after the holder's whole hold
    holder.join(60)
    assert holder.exitcode == 0


def test_file_lock_is_released_when_its_holder_is_killed(tmp_path: Path):
    path = str(tmp_path / "x.lock")
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(path, ready, 3600))
    holder.start()
    assert ready.wait(60)
    holder.kill()
    holder.join()
    with file_lock(path):  # would block for an hour if a dead holder kept it
        pass


def test_an_object_store_lock_is_exclusive_and_a_stale_one_is_taken_over():
    import fsspec

    mem = fsspec.filesystem("memory")
    url = "/locks/v1.lock"
    with file_lock(url, fs=mem, timeout_s=5):
        assert mem.exists(url)
        with pytest.raises(TimeoutError), file_lock(url, fs=mem, timeout_s=0.2):
            pass
    assert not mem.exists(url)  # released: the lease file is gone
    mem.pipe(url, f"12345 {time.time() - 3600}\n".encode())  # left by a killed holder an hour ago
    with file_lock(url, fs=mem, timeout_s=0.2, stale_s=120):
        pass
