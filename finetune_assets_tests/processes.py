"""Killing a whole process tree the way a node failure does (tests of crashes and restarts)."""

from __future__ import annotations

import os
import signal

from finetune_assets.core.launchers.local import process_tree


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal every process group in the tree of ``pid`` (torchrun, its workers, their loader
    workers).
    """
    for pgid in sorted(set(process_tree(pid).values())):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            continue
