"""The layers stay apart: nothing under ``finetune_assets/core/`` imports Dagster (what runs in a
training pod, a slice worker or the CLI's pure paths), only ``defs/``, ``definitions.py`` and
``cli/``
do, and no two subpackages import each other.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import finetune_assets

PACKAGE = Path(finetune_assets.__file__).parent
DAGSTER = ("dagster", "dagster_k8s", "dagster_postgres", "dagster_webserver", "dagster_dg_cli")
# where Dagster may be imported: the Dagster side, the code location's root, the CLI
DAGSTER_SIDE = ("defs", "definitions.py", "cli")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(path: Path) -> list[str]:
    """Every module name ``path`` imports, imports inside functions included."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
    return names


# every module of the core, found by folder (a new module is checked without being listed)
MODULES = sorted(
    _module_name(p) for p in (PACKAGE / "core").rglob("*.py") if p.name != "__main__.py"
) + ["finetune_assets.core.training.__main__"]


def test_only_the_dagster_side_imports_dagster():
    """Static: no module outside ``defs/``, ``definitions.py`` and ``cli/`` names Dagster."""
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            {n for n in _imported_names(path) if n.split(".")[0] in DAGSTER}
        )
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in DAGSTER_SIDE
    }
    assert len(offenders) > 50  # the scan sees the package
    assert {k: v for k, v in offenders.items() if v} == {}


def test_private_dagster_apis_only_in_the_adapter():
    """``dagster._*`` has no stability promise: one adapter module holds every use."""
    users = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(n.startswith("dagster._") for n in _imported_names(path))
    }
    assert users == {"defs/dagster_internals.py"}


# Third-party libraries the modules above import, loaded once (most of the ~12 s per fresh
# interpreter); each module is then imported in a fork of that interpreter. Equivalent to a fresh
# interpreter per module because none of these loads dagster (checked before forking).
_PRELOADED = [
    "numpy",
    "pandas",
    "pyarrow",
    "torch",
    "transformers",
    "pytorch_lightning",
    "sklearn",
    "streaming",
    "matplotlib",
]

_FORK_EACH = r"""
import importlib, json, os, signal, sys, traceback

preloaded, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for name in preloaded:
    importlib.import_module(name)
if "dagster" in sys.modules:
    sys.exit("a preloaded library pulls in dagster: " + " ".join(preloaded))
results = {}
for module in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        # a child stuck on a lock it inherited dies and is reported, not waited on
        signal.alarm(300)
        os.close(read)
        try:
            importlib.import_module(module)
            message = "imports dagster" if "dagster" in sys.modules else ""
        except BaseException:
            message = traceback.format_exc()[-2000:]
        with os.fdopen(write, "w") as out:
            out.write(message)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as inp:
        message = inp.read()
    _, status = os.waitpid(pid, 0)
    results[module] = message or ("" if status == 0 else f"import died (wait status {status})")
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def import_failures() -> dict[str, str]:
    """Module -> why importing it alone failed the check ("" when it imported without dagster)."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_EACH, json.dumps(_PRELOADED), json.dumps(MODULES)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", MODULES)
def test_module_does_not_import_dagster(module, import_failures):
    assert import_failures[module] == "", (
        f"{module} pulls in dagster (it must run in a pod without it): {import_failures[module]}"
    )


def test_loading_the_code_location_never_imports_torch():
    """Every asset step process loads the code location; torch and Lightning cost ~570 MB there."""
    heavy = ["torch", "pytorch_lightning", "transformers"]
    code = (
        "import sys, json, finetune_assets.definitions; "
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def _subpackage_imports() -> dict[str, set[str]]:
    """subpackage -> the project subpackages it imports, imports inside functions included.

    A subpackage is a folder of ``core/`` or ``defs/`` (``core.sources``, ``defs.promotion``) or a
    top-level one (``cli``).
    """

    def owner(parts: tuple[str, ...]) -> str | None:
        if parts[0] in ("core", "defs") and len(parts) > 2:
            return ".".join(parts[:2])
        return parts[0] if len(parts) > 1 and parts[0] not in ("core", "defs") else None

    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        me = owner(path.relative_to(PACKAGE).parts)
        if me is None:
            continue
        edges.setdefault(me, set())
        for name in _imported_names(path):
            parts = name.split(".")
            if parts[0] != "finetune_assets":
                continue
            other = owner(tuple(parts[1:]) + ("x",))
            if other and other != me:
                edges[me].add(other)
    return edges


def test_no_import_cycle_between_subpackages():
    import graphlib

    edges = _subpackage_imports()
    assert "defs.models" in edges["defs.promotion"]  # the scan sees imports
    try:
        order = list(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"subpackages import each other: {' -> '.join(err.args[1])}")
    assert set(order) >= set(edges)


def test_no_folder_over_fifteen_modules_and_no_module_over_400_lines():
    folders: dict[Path, int] = {}
    long = {}
    for path in PACKAGE.rglob("*.py"):
        folders[path.parent] = folders.get(path.parent, 0) + 1
        lines = len(path.read_text().splitlines())
        if lines > 400:
            long[str(path.relative_to(PACKAGE))] = lines
    assert {str(f.relative_to(PACKAGE)): n for f, n in folders.items() if n > 15} == {}
    assert long == {}
