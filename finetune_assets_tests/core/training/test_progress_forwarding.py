"""Rank 0's progress lines reach the Dagster log at info, trimmed to the message, through both
launchers.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from finetune_assets.core.launchers.base import TrainingSpec, log_trainer_line
from finetune_assets.core.launchers.k8s import LogFollower
from finetune_assets.core.training import PROGRESS
from finetune_assets.defs.resources.launchers import LocalTorchrunLauncher

WORKER_LINE = (
    f"2026-11-30 06:05:46,370 INFO finetune_assets.core.training: {PROGRESS} step 3/30 (10%) | "
    "epoch 1/1 | loss 0.6931 | 12.0 samples/s | ETA 0:00:40"
)
MESSAGE = WORKER_LINE[WORKER_LINE.index(PROGRESS) :]


class _Log:
    """Records what a launcher logs, by level (the part of ``context.log`` the launchers call)."""

    def __init__(self):
        self.records: list[tuple[str, str]] = []

    def __getattr__(self, level):
        return lambda message: self.records.append((level, message))


def test_a_progress_line_loses_the_workers_prefix_and_other_lines_stay_whole():
    log = _Log()
    log_trainer_line(log, WORKER_LINE)
    log_trainer_line(log, "GPU available: False, used: False")
    log_trainer_line(log, WORKER_LINE, source="[pod-0]")
    assert log.records == [
        ("info", MESSAGE),
        ("info", "GPU available: False, used: False"),
        ("info", f"[pod-0] {MESSAGE}"),
    ]


class _EchoLauncher(LocalTorchrunLauncher):
    """The local launcher with torchrun replaced by a process that prints what a trainer prints."""

    def command(self, job):
        return [
            sys.executable,
            "-c",
            f"print('Seed set to 42'); print({WORKER_LINE!r}); print('done')",
        ]


def test_the_local_launcher_forwards_progress_as_info(tmp_path):
    log = _Log()
    _EchoLauncher().launch(
        SimpleNamespace(log=log), TrainingSpec(name="echo", config_url=str(tmp_path / "c.json"))
    )
    assert ("info", MESSAGE) in log.records
    assert [m for lvl, m in log.records if m.startswith(PROGRESS)] == [MESSAGE]


def test_the_k8s_log_follower_forwards_progress_as_info():
    follower = LogFollower(api=None, namespace="ns")
    follower.pod = "finetune-0"
    # the follower's reader tags each line with its pod
    follower._lines.put(f"[finetune-0] {WORKER_LINE}")
    log = _Log()
    follower.drain(log)
    assert log.records == [("info", f"[finetune-0] {MESSAGE}")]
