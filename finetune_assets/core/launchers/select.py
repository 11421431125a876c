"""Which launcher the code location uses: one environment variable switches local <-> Kubernetes."""

from __future__ import annotations

import json
import os

from finetune_assets.core.launchers.base import TrainingLauncher
from finetune_assets.core.launchers.fanout import FanOutRunner

LAUNCHER_ENV = "FINETUNE_ASSETS_LAUNCHER"


def launcher_from_env(environ: dict[str, str] | None = None) -> TrainingLauncher:
    """``local`` (default): torchrun subprocess. ``k8s``: Indexed-Job pods, configured from
    ``FINETUNE_ASSETS_K8S_*`` variables (see deploy/README.md).
    """
    env = os.environ if environ is None else environ
    kind = env.get(LAUNCHER_ENV, "local").strip().lower()
    if kind == "local":
        from finetune_assets.core.launchers.local import LocalTorchrunLauncher

        return LocalTorchrunLauncher(
            nproc_per_node=int(env.get("FINETUNE_ASSETS_NPROC_PER_NODE", "1"))
        )
    if kind == "k8s":
        from finetune_assets.core.launchers.k8s import K8sTorchrunLauncher

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
    time
    (default: every slice at once). ``labels`` (``dagster/run-id``, ``dagster/asset``,
    ``dagster/partition``) let a retried run replace a live Job a dead one left; ``instance`` (the
    step's Dagster instance) says whether that run is really over.
    """
    from finetune_assets.core.launchers.k8s import K8sTorchrunLauncher

    if isinstance(launcher, K8sTorchrunLauncher):
        from finetune_assets.core.launchers.k8s.fanout import K8sFanOutRunner
        from finetune_assets.core.launchers.k8s.runs import dagster_run_state

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
