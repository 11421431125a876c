"""Run a fan-out's slice workers as a Kubernetes Indexed Job: one pod per slice index.

The same machinery as training pods (``launchers/k8s/``): the same ``launcher`` resource's settings
(image, namespace, Secrets by name, service account, storage volume, security context), the same API
client, the launching pod as owner, labels that link the pods to the Dagster run, waiting reasons
and Warning events, the index-0 log streamed into the run, failure reports with each failed pod's
log tail, and the same cleanup (the Job is deleted however the run ends; ``ttlSecondsAfterFinished``
and the owner reference if this process dies). The worker pods request no GPU, run one process each
and have their own pool settings (``worker_node_selector``, ``worker_tolerations``, ``worker_*``
sizing, ``worker_k8s_config``): CPU workers must not land on (and scale up) GPU nodes.

What differs from a training gang, and why: slices are independent, so the Job controller retries
one index at a time instead of the launcher resubmitting a whole gang:

- ``backoffLimitPerIndex`` (``retries_per_index``) replaces a failed pod of one index, with the
  Job-wide ``backoffLimit`` at its per-index default (MaxInt32) so it never ends the Job first;
  ``maxFailedIndexes: 0`` fails the Job, and stops the other pods, as soon as one index is out of
  retries (a re-run redoes each index; a worker overwrites only its own part).
- ``podFailurePolicy``, first match wins: a *disrupted* pod (``DisruptionTarget``: preemption,
  eviction, node lost) is replaced without counting; exit code 137 (``OOMKilled``, or SIGKILL by
  the kubelet) and 75 (``EX_TEMPFAIL``: the worker's own "transient I/O error", e.g. an object-store
  503) *count*, so they get the index's retries (``failures.py`` has the table); any other non-zero
  exit is the worker's own error (bad spec, bad input) that would repeat, so it fails the index at
  once (``FailIndex``), as the training launcher never resubmits a failure of the training code.
- No Service and no rendezvous: workers never talk to each other; they read and write only through
  storage URLs (the object-store root), as local worker processes do.

Needs Kubernetes >= 1.29 (``backoffLimitPerIndex``, ``FailIndex``; GA in 1.33).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from finetune_assets.core.launchers.fanout import FanOut, FanOutError
from finetune_assets.core.launchers.k8s.constants import (
    API_TIMEOUT_S,
    AUTO,
    CONTAINER_NAME,
    JOB_LABEL,
)
from finetune_assets.core.launchers.k8s.failures import RETRIED_EXIT_CODES
from finetune_assets.core.launchers.k8s.launcher import K8sLauncher
from finetune_assets.core.launchers.k8s.manifests import gang_key, k8s_name
from finetune_assets.core.launchers.k8s.runs import LiveRunConflict, RunState
from finetune_assets.core.launchers.k8s.verdict import (
    Verdict,
    _completion_index,
    _condition,
    _is_failed,
    _pod_state,
    job_conditions,
    latest_pod,
    stuck_or_waiting,
)

COMPONENT = "finetune-data-worker"
MAX_INDEXES = 100_000  # the API server's limit on completions when backoffLimitPerIndex is set
UNFINISHED_OR_FAILED = "status.phase!=Succeeded"  # pods a fan-out poll needs (field selector)
UNLIMITED_BACKOFF = 2**31 - 1  # the API default of backoffLimit when backoffLimitPerIndex is set
# data workers: CPU, one process
WORKER_SETTINGS = {
    "gpus_per_node": 0,
    "nproc_per_node": 1,
    "nnodes": 1,
}


@dataclass(frozen=True)
class K8sFanOutRunner:
    """A :class:`~finetune_assets.core.launchers.fanout.FanOutRunner` that runs each index as a
    pod.
    """

    # the training launcher (the ``launcher`` resource): one place for image, namespace, secrets...
    launcher: K8sLauncher
    # dagster/run-id, dagster/asset, dagster/partition
    labels: Mapping[str, str] = field(default_factory=dict)
    parallelism: int | None = None  # pods at once; None = every index at once
    retries_per_index: int = 2  # backoffLimitPerIndex
    # Dagster's word on a left-over Job's run (core/launchers/k8s/runs.py); None: every left-over
    # is an orphan
    run_state: RunState | None = None

    def __post_init__(self) -> None:
        if self.parallelism is not None and self.parallelism < 1:
            raise ValueError(
                f"parallelism={self.parallelism}: at least 1 pod at a time (or None for every "
                "index)"
            )
        if self.retries_per_index < 0:
            raise ValueError(f"retries_per_index={self.retries_per_index} must be >= 0")

    @property
    def workers(self) -> K8sLauncher:
        """The launcher with the worker pods' sizing (see :data:`WORKER_SETTINGS`): a copy of the
        (pydantic) resource, fields replaced.
        """
        la = self.launcher
        return la.model_copy(
            update={
                **WORKER_SETTINGS,
                "node_selector": la.worker_node_selector,
                "tolerations": la.worker_tolerations,
                "cpu_request": la.worker_cpu_request,
                "memory_request": la.worker_memory_request,
                "memory_limit": la.worker_memory_limit,
                "k8s_config": la.worker_k8s_config,
                "cpu_limit": AUTO,
                "shm_size": AUTO,
            }
        )

    def command(self, job: FanOut) -> list[str]:
        """The worker command; a local interpreter path (``sys.executable``) becomes the image's
        ``python``.
        """
        cmd = list(job.command)
        if cmd and (cmd[0] == sys.executable or os.path.basename(cmd[0]).startswith("python")):
            cmd[0] = self.launcher.python
        return cmd

    def dedupe_key(self, job: FanOut) -> str:
        """One value per asset + partition when the labels name them (a retried run replaces a live
        Job left by a dead one), else per fan-out name (a retried step of the same run).
        """
        return (
            gang_key(self.labels, self.launcher.gang_scope)
            or hashlib.sha256(job.name.encode()).hexdigest()[:40]
        )

    def render(self, job: FanOut, name: str, image: str | None = None) -> dict[str, Any]:
        """The Indexed Job as an API-ready dict (camelCase, no secrets)."""
        if not 1 <= job.count <= MAX_INDEXES:
            raise ValueError(
                f"fan-out {job.name!r}: count={job.count}; a Job with per-index retries takes 1 to "
                f"{MAX_INDEXES} indexes: use fewer, larger slices"
            )
        workers = self.workers
        pod_spec, container = workers.pod_parts(
            self.command(job), workers._env(job.env, "FanOut.env")
        )
        job_spec = {
            "completionMode": "Indexed",
            "completions": job.count,
            "parallelism": min(self.parallelism or job.count, job.count),
            # The controller checks backoffLimit whatever backoffLimitPerIndex says; the API default
            # with per-index retries is MaxInt32, but Dagster's job builder writes 0 (one OOM would
            # fail the whole Job): say it explicitly.
            "backoffLimit": UNLIMITED_BACKOFF,
            "backoffLimitPerIndex": self.retries_per_index,
            "maxFailedIndexes": 0,
            "podFailurePolicy": {
                "rules": [  # first match wins; see the module docstring
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    },
                    {
                        "action": "Count",
                        "onExitCodes": {
                            "containerName": CONTAINER_NAME,
                            "operator": "In",
                            "values": list(RETRIED_EXIT_CODES),
                        },
                    },
                    {
                        "action": "FailIndex",
                        "onExitCodes": {
                            "containerName": CONTAINER_NAME,
                            "operator": "NotIn",
                            "values": [0],
                        },
                    },
                ]
            },
            "activeDeadlineSeconds": workers.timeout_s,
            "ttlSecondsAfterFinished": workers.ttl_seconds_after_finished,
        }
        labels = workers._labels(self.labels, name, self.dedupe_key(job))
        return workers.job_manifest(name, image, labels, pod_spec, container, job_spec, COMPONENT)

    def run(self, job: FanOut, log: Callable[[str], None]) -> None:
        lines = _Lines(log)
        workers = self.workers
        api = workers.api(lines)
        owner, owner_image = workers._owner_reference(lines, api)
        image = workers.image or owner_image
        try:
            workers._remove_live_gangs(
                lines,
                api,
                self.dedupe_key(job),
                "fan-out Job",
                run_state=self.run_state,
                own_run=self.labels.get("dagster/run-id"),
            )
        except LiveRunConflict as e:
            raise FanOutError(str(e)) from None
        name = k8s_name(job.name)
        manifest = self.render(job, name, image)
        parallelism = manifest["spec"]["parallelism"]
        ns = workers.namespace
        lines.info(
            f"Launching fan-out Job {ns}/{name}: {job.count} index(es), {parallelism} pod(s) at "
            "a time, "
            f"up to {self.retries_per_index} retries per index, image {image}, command: "
            f"{' '.join(self.command(job))}"
        )
        workers.run_job(
            lines,
            api,
            manifest,
            owner,
            what="Fan-out Job",
            assess_fn=lambda status, pods: assess_fanout(status, pods, job.count, parallelism),
            fail_fn=lambda status, pods, why: self._fail(
                lines, api, name, job.count, status, pods, why
            ),
            progress=_Progress(lines, f"Fan-out Job {ns}/{name}", job.count),
            pod_fields=UNFINISHED_OR_FAILED,  # completedIndexes tells the rest
        )

    def _fail(self, log, api, name: str, count: int, status, pods: Sequence[Any], why: str) -> None:
        # the pods as of (not before) the status that failed the index
        with contextlib.suppress(Exception):
            pods = api.core_api.list_namespaced_pod(
                self.launcher.namespace,
                label_selector=f"{JOB_LABEL}={name}",
                field_selector=UNFINISHED_OR_FAILED,
                _request_timeout=API_TIMEOUT_S,
            ).items
        failed = indexes(status.failed_indexes if status else None)
        done = indexes(status.completed_indexes if status else None)
        # the last pod of each failed index; without one (timeout, stuck pods), every unfinished pod
        culprits = [p for i in sorted(failed) if (p := latest_pod(pods, i)) is not None] or [
            p for p in pods if _completion_index(p) not in done
        ]
        report = self.workers.failure_report(log, api, name, culprits, unit="index")
        unfinished = sorted(set(range(count)) - done)
        which = (
            f"failed index(es) {sorted(failed)}"
            if failed
            else f"unfinished index(es) {unfinished[:20]}"
            + (f" and {len(unfinished) - 20} more" if len(unfinished) > 20 else "")
        )
        raise FanOutError(f"fan-out Job {self.launcher.namespace}/{name}: {why}; {which}\n{report}")


def assess_fanout(status, pods: Sequence[Any], count: int, parallelism: int) -> Verdict:
    """What the fan-out is doing, from a ``V1JobStatus`` and its ``V1Pod`` list.

    Failed pods of an index that still has retries are normal (the controller replaces them); an
    index in ``failedIndexes`` fails the fan-out at once, before the controller's ``Failed``.
    """
    conditions = job_conditions(status)
    if "Suspended" in conditions:  # queued (Kueue): waited on, never deleted
        return Verdict(
            "queued", f"Job suspended ({conditions['Suspended'].reason}), waiting for admission"
        )
    failed_cond = conditions.get("Failed") or conditions.get("FailureTarget")
    done, failed = (
        indexes(status.completed_indexes if status else None),
        indexes(status.failed_indexes if status else None),
    )
    if failed_cond is not None and failed_cond.reason == "DeadlineExceeded":
        return Verdict(
            "failed", f"Job failed: {failed_cond.reason}: {failed_cond.message}", failed_cond.reason
        )
    if failed:
        return Verdict("failed", f"index(es) {sorted(failed)} failed", "FailedIndexes")
    if failed_cond is not None:
        return Verdict(
            "failed",
            f"Job failed: {failed_cond.reason}: {failed_cond.message}",
            failed_cond.reason or "",
        )
    live = [p for p in pods if not (p.status and p.status.phase in ("Succeeded", "Failed"))]
    verdict = stuck_or_waiting(live, min(parallelism, count - len(done)))
    if verdict.kind != "stuck" and ("Complete" in conditions or len(done) >= count):
        return Verdict("complete", f"all {count} index(es) succeeded")
    return verdict


def indexes(text: str | None) -> set[int]:
    """``completedIndexes`` / ``failedIndexes`` ("1,3-5") as a set."""
    out: set[int] = set()
    for part in filter(None, (text or "").split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


class _Progress:
    """Says once per pod when an index's pod failed or was disrupted (and will be replaced), and
    when indexes finish.
    """

    def __init__(self, log, what: str, count: int):
        self._log, self._what, self._count = log, what, count
        self._said: set[str] = set()
        self._done: set[int] = set()

    def __call__(self, status, pods: Sequence[Any]) -> None:
        for pod in sorted(pods, key=_completion_index):
            name, index = pod.metadata.name, _completion_index(pod)
            if name in self._said:
                continue
            if (c := _condition(pod, "DisruptionTarget")) is not None:
                self._log.warning(
                    f"{self._what}: index {index}: pod {name} disrupted "
                    f"({c.reason or 'DisruptionTarget'}); "
                    "the Job controller replaces it without counting a retry"
                )
            elif _is_failed(pod):
                self._log.warning(f"{self._what}: index {index}: pod {name} {_pod_state(pod)}")
            else:
                continue
            self._said.add(name)
        done = indexes(status.completed_indexes if status else None)
        if done != self._done:
            self._done = done
            self._log.info(f"{self._what}: {len(done)}/{self._count} index(es) succeeded")


class _Lines:
    """The launcher helpers' ``log.info/warning/error`` onto the protocol's one ``log(str)``;
    debug is dropped.
    """

    def __init__(self, log: Callable[[str], None]):
        self._log = log

    def info(self, msg: str) -> None:
        self._log(msg)

    warning = error = info

    def debug(self, msg: str) -> None:
        pass
