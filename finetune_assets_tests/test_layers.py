"""The layers stay apart: what runs in a training pod, and the pure data path, never import Dagster."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "finetune_assets.training.__main__",
        "finetune_assets.training.run",
        "finetune_assets.training.callbacks",
        "finetune_assets.training.pruning",
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
        "finetune_assets.benchmark_sets",
    ],
)
def test_module_does_not_import_dagster(module):
    code = f"import sys, {module}; sys.exit(1 if 'dagster' in sys.modules else 0)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, (
        f"{module} pulls in dagster (it must run in a pod without it): {proc.stderr[-2000:]}"
    )
