"""What a launcher is given (the training spec, the run it trains for) and the one torchrun command
both launchers run.

Dagster-free: the Dagster resources (``defs/resources/launchers.py``) hold the launchers' fields
and hand the step's context over as a :class:`RunContext`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from finetune_assets.core.training import PROGRESS

TRAINER_MODULE = "finetune_assets.core.training"


@dataclass(frozen=True)
class TrainingSpec:
    """One training run, as the ``finetuned_model`` asset hands it to a launcher."""

    name: str  # unique per Dagster run and partition; DNS-1123 safe (used for k8s names, rdzv id)
    config_url: str  # trainer config JSON, readable by every worker (fsspec URL or local path)
    labels: Mapping[str, str] = field(default_factory=dict)  # run id, asset, partition
    env: Mapping[str, str] = field(default_factory=dict)  # non-secret environment for the trainer


class Log(Protocol):
    """Where a launcher reports: a ``logging.Logger``, or Dagster's ``context.log``."""

    def debug(self, msg: str) -> None: ...
    def info(self, msg: str) -> None: ...
    def warning(self, msg: str) -> None: ...
    def error(self, msg: str) -> None: ...


class RunContext(Protocol):
    """The run a launcher trains for, as much of it as a launcher needs (Dagster's step context
    without Dagster): its log, its id, and another run's status, so that a live gang left by a run
    that is still going is told from an orphan (``k8s/runs.py``).
    """

    @property
    def log(self) -> Log: ...

    @property
    def run_id(self) -> str: ...

    def run_state(self, run_id: str) -> str | None:
        """The run's status while it is live; None when it is finished or unknown."""
        ...


def log_trainer_line(log: Log, line: str, source: str = "") -> None:
    """One line of trainer output into the run's log, at info, as both launchers forward it.

    A progress line (rank 0's ``progress: step 120/400 | epoch | loss | samples/s | ETA``) loses the
    worker's timestamp and logger name, so it reads the same in the UI for a local run and a pod.
    """
    at = line.find(PROGRESS)
    text = line[at:] if at >= 0 else line
    log.info(f"{source} {text}" if source else text)


class TrainingFailed(Exception):
    """The trainer exited non-zero; the message carries its last error lines."""


def trainer_args(config_url: str, module: str = TRAINER_MODULE) -> list[str]:
    return ["-m", module, "--config", config_url]


def torchrun_command(
    config_url: str,
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    max_restarts: int = 0,
    node_rank: str | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    rdzv_conf: Mapping[str, object] | None = None,
    python: str | None = None,
    module: str = TRAINER_MODULE,
) -> list[str]:
    """``torchrun`` for one node. Single node uses ``--standalone``; multi-node uses c10d
    rendezvous.
    """
    cmd = [python or sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        if not rdzv_endpoint or not rdzv_id:
            raise ValueError("multi-node torchrun needs rdzv_endpoint and rdzv_id")
        cmd += [
            "--nnodes",
            str(nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            rdzv_endpoint,
            "--rdzv-id",
            rdzv_id,
        ]
        if rdzv_conf:
            cmd += ["--rdzv-conf", ",".join(f"{k}={v}" for k, v in rdzv_conf.items())]
        if node_rank is not None:
            cmd += ["--node-rank", node_rank]
    cmd += ["--nproc-per-node", str(nproc_per_node), "--max-restarts", str(max_restarts)]
    return cmd + trainer_args(config_url, module)
