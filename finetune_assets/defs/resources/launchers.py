"""The ``launcher`` resource: where training (and the data assets' slice workers) run.

The launchers themselves are Dagster-free (``core/launchers/``): each resource here holds the
fields a user configures (launchpad: ``resources.launcher.config``), mixes in its core launcher,
and hands it the step's context as a :class:`~finetune_assets.core.launchers.base.RunContext`.
One environment variable picks the launcher (:func:`launcher_from_env`).
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import dagster as dg

from finetune_assets.core.launchers.base import Log, TrainingSpec
from finetune_assets.core.launchers.fanout import FanOutRunner
from finetune_assets.core.launchers.local import LocalTorchrun

if TYPE_CHECKING:  # the Kubernetes modules load only where the k8s launcher is used
    from finetune_assets.core.launchers.k8s.runs import RunState

LAUNCHER_ENV = "FINETUNE_ASSETS_LAUNCHER"


class TrainingLauncher(dg.ConfigurableResource, ABC):
    """Runs a :class:`TrainingSpec` to completion or raises
    :class:`~finetune_assets.core.launchers.base.TrainingFailed`.
    """

    nproc_per_node: int = 1
    max_restarts: int = 0

    @abstractmethod
    def launch(self, context: dg.AssetExecutionContext, job: TrainingSpec) -> None: ...


def dagster_run_state(instance: dg.DagsterInstance) -> RunState:
    """:data:`~finetune_assets.core.launchers.k8s.runs.RunState` from the Dagster instance the
    step runs in.
    """

    def state(run_id: str) -> str | None:
        run = instance.get_run_by_id(run_id)
        return None if run is None or run.is_finished else run.status.value

    return state


class DagsterRun:
    """The step's context as a core launcher's ``RunContext``; read when asked, so a launcher that
    needs only the log (the local one) touches nothing else.
    """

    def __init__(self, context: dg.AssetExecutionContext):
        self._context = context

    @property
    def log(self) -> Log:
        return self._context.log

    @property
    def run_id(self) -> str:
        return self._context.run.run_id

    def run_state(self, run_id: str) -> str | None:
        return dagster_run_state(self._context.instance)(run_id)


class LocalTorchrunLauncher(LocalTorchrun, TrainingLauncher):
    """``torchrun --standalone --nproc-per-node N`` on this machine (CPU with gloo, or local
    GPUs).
    """

    # A worker killed mid-run (OOM killer, a stray SIGKILL) costs one restart of the worker group,
    # which resumes from the last checkpoint; a trainer that fails again fails the asset.
    max_restarts: int = 1
    python: str | None = None  # interpreter for torchrun; default: the one running Dagster
    cwd: str | None = None
    omp_num_threads: int | None = None  # per worker; default: cores / nproc_per_node

    def launch(self, context: dg.AssetExecutionContext, job: TrainingSpec) -> None:
        self.train(DagsterRun(context), job)


def launcher_from_env(environ: dict[str, str] | None = None) -> TrainingLauncher:
    """``local`` (default): torchrun subprocess. ``k8s``: Indexed-Job pods, configured from
    ``FINETUNE_ASSETS_K8S_*`` variables (see deploy/README.md).
    """
    env = os.environ if environ is None else environ
    kind = env.get(LAUNCHER_ENV, "local").strip().lower()
    if kind == "local":
        return LocalTorchrunLauncher(
            nproc_per_node=int(env.get("FINETUNE_ASSETS_NPROC_PER_NODE", "1"))
        )
    if kind == "k8s":
        from finetune_assets.defs.resources.k8s_launcher import K8sTorchrunLauncher

        prefix = "FINETUNE_ASSETS_K8S_"
        fields = set(K8sTorchrunLauncher.model_fields)
        settings = {k[len(prefix) :].lower(): v for k, v in env.items() if k.startswith(prefix)}
        unknown = sorted(set(settings) - fields)
        if unknown:
            raise ValueError(f"unknown {prefix}* settings: {unknown}; known: {sorted(fields)}")
        # dicts and lists (node_selector, tolerations, env_secret_names ...) are given as JSON
        parsed = {
            k: json.loads(v) if v.lstrip()[:1] in ("{", "[") else v for k, v in settings.items()
        }
        return K8sTorchrunLauncher(**parsed)
    raise ValueError(f"{LAUNCHER_ENV}={kind!r}: expected 'local' or 'k8s'")


def fanout_runner(
    launcher: TrainingLauncher,
    workers: int | None = None,
    labels: dict[str, str] | None = None,
    instance=None,
) -> FanOutRunner:
    """Where the data assets' slice workers run: beside the training, from the same ``launcher``
    resource, so a launchpad override of ``resources.launcher.config`` reaches them too.

    Any launcher but Kubernetes (local torchrun): subprocesses with its ``python``, ``workers`` at a
    time (default: the usable cores). Kubernetes launcher: an Indexed Job with one pod per slice
    (``core/launchers/k8s/fanout.py``) with its image, namespace and secrets, ``workers`` pods at a
    time (default: every slice at once). ``labels`` (``dagster/run-id``, ``dagster/asset``,
    ``dagster/partition``) let a retried run replace a live Job a dead one left; ``instance`` (the
    step's Dagster instance) says whether that run is really over.
    """
    from finetune_assets.defs.resources.k8s_launcher import K8sTorchrunLauncher

    if isinstance(launcher, K8sTorchrunLauncher):
        from finetune_assets.core.launchers.k8s.fanout import K8sFanOutRunner

        run_state = dagster_run_state(instance) if instance is not None else None
        return K8sFanOutRunner(
            launcher=launcher,
            labels=dict(labels or {}),
            parallelism=workers,
            run_state=run_state,
        )
    # every other launcher trains on this machine: its workers are local subprocesses
    from finetune_assets.core.launchers.fanout import LocalFanOutRunner, usable_cores

    python = getattr(launcher, "python", None)  # LocalTorchrunLauncher's interpreter
    return LocalFanOutRunner(workers=workers or usable_cores(), python=python)
