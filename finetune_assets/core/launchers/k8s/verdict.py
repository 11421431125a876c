"""The supervision verdict: a pure function of Job and Pod objects."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from finetune_assets.core.launchers.k8s.constants import COMPLETION_INDEX_ANNOTATION
from finetune_assets.core.launchers.k8s.failures import (
    infrastructure_reason,
    limit_eviction,
    waiting_is_fatal,
)


class GangDisrupted(Exception):
    """A pod of the gang was disrupted (eviction, preemption, node lost): resubmit rather than
    fail.
    """


@dataclass(frozen=True)
class Verdict:
    kind: str  # running | waiting | queued | complete | disrupted | failed | stuck
    why: str = ""
    reason: str = ""  # the Job condition's reason, when the Job failed


def assess(status, pods: Sequence[Any], nnodes: int) -> Verdict:
    """What the gang is doing, from a ``V1JobStatus`` and its ``V1Pod`` list.

    Order matters: a disruption wins over the failures it causes in the peers (they fail because
    their peer vanished), and a failed pod wins over the Job controller's slower ``Failed``. A
    disruption is a ``DisruptionTarget`` condition or an infrastructure failure without one
    (``failures.py``: kubelet evictions, admission errors, node shutdown). Then the Job's terminal
    conditions (``Failed``, ``Complete``) before ``Suspended``: a dead Job that also reads
    suspended must not be waited on for ``queue_timeout_s``.
    """
    pods = current_admission(status, pods)
    limits = [f"pod {p.metadata.name}: {why}" for p in pods if (why := limit_eviction(p))]
    if limits:  # its own size limit: evicted again after any resubmission
        return Verdict("failed", "; ".join(limits))
    disrupted = [
        f"pod {p.metadata.name}: {c.reason or 'DisruptionTarget'}: {c.message or ''}".rstrip(": ")
        for p in pods
        if (c := _condition(p, "DisruptionTarget")) and not limit_eviction(p)
    ]
    disrupted += [
        f"pod {p.metadata.name}: {why}"
        for p in pods
        if not _condition(p, "DisruptionTarget") and (why := infrastructure_reason(p))
    ]
    if disrupted:
        return Verdict("disrupted", "; ".join(disrupted))
    conditions = job_conditions(status)
    # Terminal conditions first: a finished Job is finished even if it also reads Suspended.
    failed_cond = conditions.get("Failed") or conditions.get("FailureTarget")
    if failed_cond is not None:
        why = f"Job failed: {failed_cond.reason}: {failed_cond.message}"
        if failed_cond.reason != "DeadlineExceeded" and any(_is_failed(p) for p in pods):
            why = "pod(s) failed"
        return Verdict("failed", why, failed_cond.reason or "")
    if "Complete" in conditions or "SuccessCriteriaMet" in conditions:
        return Verdict("complete", f"all {nnodes} pod(s) succeeded")
    # queued (Kueue) or suspended (preempted): waited on, never deleted
    if "Suspended" in conditions:
        c = conditions["Suspended"]
        return Verdict(
            "queued",
            f"Job suspended ({c.reason or 'Suspended'}: {c.message or ''}), waiting for admission",
        )
    # fail fast: do not wait for the Job controller or hung peers
    if any(_is_failed(p) for p in pods):
        return Verdict("failed", "pod(s) failed")
    verdict = stuck_or_waiting(pods, nnodes)
    if verdict.kind != "stuck" and status and (status.succeeded or 0) >= nnodes:
        return Verdict("complete", f"all {nnodes} pod(s) succeeded")
    return verdict


class VanishedPods:
    """Pods seen unfinished at one poll and gone at the next: deleted, so evicted, preempted or
    taken by the taint manager (this launcher deletes only the whole Job, after supervising).

    Their ``DisruptionTarget`` condition lives only as long as the pod object. A trainer that stops
    at SIGTERM ends its pod within a second, and the Job controller, which ignores the failure
    (podFailurePolicy ``Ignore``), drops its finalizer and replaces it: often before the next poll.
    Only meaningful while the Job is neither suspended nor finished (both delete pods on purpose).
    """

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}  # unfinished, undeleted pod name -> completion index

    def update(self, pods: Sequence[Any]) -> list[str]:
        """Record this poll's pods; return the ones gone since the last poll."""
        names = {p.metadata.name for p in pods}
        gone = [
            f"pod {name} (index {index}) was deleted while it ran, before a poll saw why "
            "(an eviction, a preemption or a drained node)"
            for name, index in self.seen.items()
            if name not in names
        ]
        self.seen = {  # a pod already being deleted shows why (or the Job's own suspension did)
            p.metadata.name: _completion_index(p)
            for p in pods
            if not (p.status and p.status.phase in ("Succeeded", "Failed"))
            and not p.metadata.deletion_timestamp
        }
        return gone


def ended_on_purpose(job) -> bool:
    """The Job is suspended or has a terminal (or failure-target) condition: the Job controller
    deletes its pods itself.
    """
    if job.spec is not None and job.spec.suspend:
        return True
    conditions = job_conditions(job.status)
    return any(
        t in conditions
        for t in ("Suspended", "Failed", "FailureTarget", "Complete", "SuccessCriteriaMet")
    )


def current_admission(status, pods: Sequence[Any]) -> list[Any]:
    """The pods of the Job's current run: a resumed Job (Kueue re-admitted it after a preemption)
    gets a new ``status.startTime``; pods that finished before it were killed by the suspension and
    say nothing about the new pods.
    """
    start = getattr(status, "start_time", None)
    if start is None:
        return list(pods)

    def earlier(p) -> bool:
        created = p.metadata.creation_timestamp
        finished = p.status is not None and p.status.phase in ("Succeeded", "Failed")
        return finished and created is not None and created < start

    return [p for p in pods if not earlier(p)]


def job_conditions(status) -> dict[str, Any]:
    """The Job's conditions that are true, by type."""
    return {c.type: c for c in (status.conditions or []) if c.status == "True"} if status else {}


def stuck_or_waiting(pods: Sequence[Any], expected: int) -> Verdict:
    """For pods that have not finished: stuck (a waiting reason that will not fix itself), waiting
    (pods missing or Pending, with the scheduler's / kubelet's reasons) or running.
    """
    stuck = [(p, r) for p in pods if (r := _fatal_waiting_reason(p))]
    if stuck:
        return Verdict(
            "stuck",
            "cannot start its pods: " + "; ".join(f"{p.metadata.name}: {r}" for p, r in stuck),
        )
    notes = [
        f"pod {p.metadata.name}: {w}"
        for p in sorted(pods, key=_completion_index)
        if (w := _pod_wait(p))
    ]
    waiting = len(pods) < expected or any(
        p.status is None or p.status.phase == "Pending" for p in pods
    )
    if len(pods) < expected:
        notes.insert(0, f"{expected - len(pods)} of {expected} pod(s) not created")
    return Verdict("waiting" if waiting else "running", "; ".join(notes))


# -- helpers --------------------------------------------------------------------------------------


def _condition(pod, ctype: str):
    for c in (pod.status.conditions or []) if pod.status else []:
        if c.type == ctype and c.status == "True":
            return c
    return None


def _is_failed(pod) -> bool:
    return bool(pod.status and pod.status.phase == "Failed")


def _pod_wait(pod) -> str:
    """Why a pod is not (fully) running, in the scheduler's / kubelet's words; "" when it is
    fine.
    """
    if pod.status is None:
        return "no status yet"
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False":
            return f"{c.reason or 'Unscheduled'}: {c.message or ''}".rstrip(": ")
        # e.g. its node NotReady
        if c.type == "Ready" and c.status == "False" and pod.status.phase == "Running":
            return f"not Ready ({c.reason or 'no reason given'}): {c.message or ''}".rstrip(": ")
    if pod.status.phase == "Pending":
        for cs in pod.status.container_statuses or []:
            if cs.state and cs.state.waiting is not None:
                waiting = cs.state.waiting
                return f"{waiting.reason or 'Waiting'} {waiting.message or ''}".strip()
        return "Pending"
    return ""


def latest_pod(pods: Sequence[Any], index: int):
    """The newest pod of a completion index (the Job controller replaces failed and disrupted
    ones), or None.
    """

    def newest(
        p,
    ) -> tuple[float, bool]:  # creation times have 1 s resolution: an unfinished pod wins a tie
        created = p.metadata.creation_timestamp
        return (
            created.timestamp() if created else 0.0,
            not (p.status and p.status.phase in ("Succeeded", "Failed")),
        )

    return max((p for p in pods if _completion_index(p) == index), key=newest, default=None)


def _completion_index(pod) -> int:
    meta = pod.metadata
    raw = (meta.annotations or {}).get(COMPLETION_INDEX_ANNOTATION) or (meta.labels or {}).get(
        COMPLETION_INDEX_ANNOTATION
    )
    try:
        return int(raw)
    except (TypeError, ValueError):
        return -1


def _fatal_waiting_reason(pod) -> str | None:
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting_is_fatal(waiting.reason, waiting.message):
            return f"{waiting.reason}: {waiting.message or ''}".strip()
    return None


def _pod_state(pod) -> str:
    phase = pod.status.phase if pod.status else "Unknown"
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        term = cs.state.terminated if cs.state else None
        if term is not None:
            return f"{phase}, exit code {term.exit_code} ({term.reason or 'no reason'})"
    if phase == "Pending":
        return f"{phase}, {_why_pending(pod)}"
    return phase


def _why_pending(pod) -> str:
    """Where a Pending pod is stuck: unscheduled (the scheduler's reason, or its scheduling
    gates), or bound to a node whose kubelet has not started it (waiting container reasons).
    """
    spec = pod.spec
    gates = [g.name for g in (getattr(spec, "scheduling_gates", None) or [])] if spec else []
    if gates:
        return f"not scheduled: held by scheduling gates {gates}"
    node = spec.node_name if spec else None
    if not node:
        for c in (pod.status.conditions or []) if pod.status else []:
            if c.type == "PodScheduled" and c.status == "False":
                return f"not scheduled: {c.reason}: {c.message}"
        return "not scheduled yet (no scheduler has tried)"
    waiting = [
        f"{cs.name}: {cs.state.waiting.reason}"
        for cs in (pod.status.container_statuses or [])
        if cs.state and cs.state.waiting and cs.state.waiting.reason
    ]
    return f"on node {node}, not started" + (f" ({'; '.join(waiting)})" if waiting else "")
