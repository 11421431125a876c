"""A first run prints what a person needs: known, harmless notices are silenced where they arise,
and nothing else (the filters name message, category and module; they are not a blanket ignore).
"""

from __future__ import annotations

import subprocess
import sys


def test_loading_the_definitions_prints_no_partitioned_check_preview_warning():
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import finetune_assets.definitions"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "partitions_def on an AssetCheckSpec" not in proc.stderr


def _shown(setup: str, warn: str) -> str:
    """stderr of a fresh interpreter that runs ``setup`` then ``warn`` under the default warning
    filters (pytest's own capture would override the filters under test).
    """
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c", f"{setup}\nimport warnings\n{warn}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def test_the_same_preview_warning_from_elsewhere_still_shows():
    out = _shown(
        "import dagster as dg, finetune_assets.defs.versions.partitions",
        "warnings.warn('Specifying a partitions_def on an AssetCheckSpec is currently in preview', "
        "dg.PreviewWarning)",
    )
    assert "PreviewWarning: Specifying a partitions_def" in out


def test_the_trainers_filters_keep_other_warnings():
    setup = (
        "from finetune_assets.core.training.notices import quiet_known_notices; "
        "quiet_known_notices()"
    )
    # One interpreter (importing the trainer costs seconds): a marker on stderr separates the
    # warnings that must show from Lightning's own, which must not. Warnings are written to stderr
    # as they are raised.
    out = _shown(
        setup,
        "warnings.warn('a real problem', UserWarning)\n"
        "warnings.warn('`isinstance(treespec, LeafSpec)` is deprecated', FutureWarning)\n"
        "import sys; sys.stderr.write('\\n--- lightning below ---\\n'); sys.stderr.flush()\n"
        "import pytorch_lightning.utilities._pytree as t\n"
        "warnings.warn_explicit('`isinstance(treespec, LeafSpec)` is deprecated', FutureWarning, "
        "t.__file__, 21, module='pytorch_lightning.utilities._pytree')",
    )
    shown, marker, hidden = out.partition("\n--- lightning below ---\n")
    assert marker, out[-2000:]
    assert "UserWarning: a real problem" in shown
    # the same words from our code still show
    assert "FutureWarning: `isinstance(treespec, LeafSpec)`" in shown
    assert "LeafSpec" not in hidden  # Lightning's own use of it is silenced
