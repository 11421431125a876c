"""The layers stay apart: what runs in a training pod, and the pure data path, never import
Dagster.
"""

import json
import subprocess
import sys

import pytest

MODULES = [
    "finetune_assets.training.__main__",
    "finetune_assets.training.run",
    "finetune_assets.training.callbacks",
    "finetune_assets.training.pruning",
    "finetune_assets.training.study_storage",
    "finetune_assets.training.process_group",
    "finetune_assets.training.streaming_loader",
    "finetune_assets.training.shard_cache",
    "finetune_assets.tracking",
    "finetune_assets.viz",
    "finetune_assets.storage",
    "finetune_assets.contracts",
    "finetune_assets.inference",
    "finetune_assets.gate",
    "finetune_assets.data.sources",
    "finetune_assets.data.validate",
    "finetune_assets.data.slices",
    "finetune_assets.data.tokenize",
    "finetune_assets.data.shards",
    "finetune_assets.data.baseline",
    "finetune_assets.data.evaluate",
    "finetune_assets.data.batching",
    "finetune_assets.data.vocab_fit",
    "finetune_assets.data.token_index",
    "finetune_assets.benchmark_sets",
]

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
    """subpackage -> the project subpackages it imports, imports inside functions included."""
    import ast
    from pathlib import Path

    import finetune_assets

    pkg = Path(finetune_assets.__file__).parent
    subpackages = {p.name for p in pkg.iterdir() if (p / "__init__.py").exists()}
    edges: dict[str, set[str]] = {name: set() for name in subpackages}
    for path in pkg.rglob("*.py"):
        owner = path.relative_to(pkg).parts[0]
        if owner not in subpackages:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                parts = name.split(".")
                if parts[0] == "finetune_assets" and len(parts) > 1 and parts[1] in subpackages:
                    if parts[1] != owner:
                        edges[owner].add(parts[1])
    return edges


def test_no_import_cycle_between_subpackages():
    import graphlib

    edges = _subpackage_imports()
    assert "promotion" in edges and "assets" in edges["promotion"]  # the scan sees imports
    try:
        order = list(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"subpackages import each other: {' -> '.join(err.args[1])}")
    assert set(order) == set(edges)
