"""Supervision: poll a running Job, stream pod 0, say why pods wait, fail fast with every pod's
log tail.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from finetune_assets.core.launchers.base import TrainingFailed
from finetune_assets.core.launchers.k8s import kueue
from finetune_assets.core.launchers.k8s.constants import (
    API_TIMEOUT_S,
    CONTAINER_NAME,
    EVENTS_EVERY_S,
    JOB_LABEL,
)
from finetune_assets.core.launchers.k8s.failures import RESUBMIT, classify_failure
from finetune_assets.core.launchers.k8s.logs import LogFollower, _safe_logs, _warning_events
from finetune_assets.core.launchers.k8s.verdict import (
    GangDisrupted,
    VanishedPods,
    _completion_index,
    _is_failed,
    _pod_state,
    _pod_wait,
    ended_on_purpose,
    latest_pod,
)

MAX_EVENT_OBJECTS = 10  # Events are read for the Job and at most this many waiting pods
# The Job controller's FailedCreate for a pod template that admission will always refuse (Pod
# Security, a ValidatingAdmissionPolicy); quota refusals ("exceeded quota") are waited on.
ADMISSION_REFUSAL = re.compile(
    r"FailedCreate: Error creating: pods \S+ is forbidden: (?:violates PodSecurity|"
    r"ValidatingAdmissionPolicy)[^;]*"
)


class SupervisionMixin:
    """The supervision half of the launcher."""

    def _supervise(
        self,
        log,
        api,
        name: str,
        follower: LogFollower,
        what: str,
        assess_fn,
        fail_fn,
        progress,
        pod_fields: str | None = None,
        vanished: VanishedPods | None = None,
    ) -> None:
        """Poll the Job and its pods (this Job's only: label selector, plus ``pod_fields``, e.g. the
        fan-out leaves out Succeeded pods, so a poll stays small at 10,000 indexes). With
        ``vanished`` (a gang), a pod deleted between two polls is a disruption, as its
        ``DisruptionTarget`` would have been.
        """
        ns = self.namespace
        now = time.monotonic()
        deadline, start_deadline = now + self.timeout_s, now + self.start_timeout_s
        selector = f"{JOB_LABEL}={name}"
        started = False
        last_note, events, events_read = "", "", 0.0
        queue_deadline = now + self.queue_timeout_s
        while True:
            follower.drain(log)
            pods = api.core_api.list_namespaced_pod(
                ns,
                label_selector=selector,
                _request_timeout=API_TIMEOUT_S,
                **({"field_selector": pod_fields} if pod_fields else {}),
            ).items
            pod0 = latest_pod(pods, 0)  # a retried index has several pods: follow the newest
            if (
                pod0 is not None
                and pod0.status
                and pod0.status.phase in ("Running", "Succeeded", "Failed")
            ):
                follower.start(pod0.metadata.name)
            job = api.batch_api.read_namespaced_job(name, ns, _request_timeout=API_TIMEOUT_S)
            status = job.status
            verdict = assess_fn(status, pods)
            gone = vanished.update(pods) if vanished is not None else []
            if gone and verdict.kind != "disrupted" and not ended_on_purpose(job):
                raise GangDisrupted(f"{what} {ns}/{name} disrupted: {'; '.join(gone)}")
            if progress is not None:
                progress(status, pods)
            if verdict.kind == "complete":
                follower.finish(pod0.metadata.name if pod0 is not None else None, log)
                log.info(f"{what} {ns}/{name}: {verdict.why}")
                return
            if verdict.kind == "disrupted":
                raise GangDisrupted(f"{what} {ns}/{name} disrupted: {verdict.why}")
            if verdict.reason == "DeadlineExceeded":
                fail_fn(status, pods, f"timed out after {self.timeout_s}s (activeDeadlineSeconds)")
            if verdict.kind in ("failed", "stuck"):
                fail_fn(status, pods, verdict.why)
            now = time.monotonic()
            # Kueue holds the gang: its clocks start at admission, as the Job's does
            if verdict.kind == "queued":
                if started:  # it ran, and is suspended again: Kueue preempted (evicted) it
                    self._say_preempted(log, api, what, job)
                    started, queue_deadline = False, now + self.queue_timeout_s
                if now > queue_deadline:
                    fail_fn(
                        status,
                        pods,
                        f"not admitted within queue_timeout_s={self.queue_timeout_s}: "
                        f"{verdict.why}",
                    )
                deadline, start_deadline = now + self.timeout_s, now + self.start_timeout_s
            started = started or verdict.kind == "running"
            if verdict.kind == "waiting" and now - events_read > EVENTS_EVERY_S:
                # not one call per pod
                waiting = [p.metadata.name for p in pods if _pod_wait(p)][:MAX_EVENT_OBJECTS]
                events, events_read = _warning_events(api, ns, [name, *waiting]), now
                refused = ADMISSION_REFUSAL.search(events)
                if refused:  # the API server will refuse every pod of this template
                    fail_fn(status, pods, f"the API server refuses the pods: {refused.group(0)}")
            note = verdict.why + (
                f"; events: {events}" if events and verdict.kind == "waiting" else ""
            )
            # say it once, when it changes; ContainerCreating is only info
            if note and note != last_note:
                trouble = events or verdict.kind == "running" or "Unschedulable" in note
                (log.warning if trouble else log.info)(f"{what} {ns}/{name}: {note}")
            last_note = note
            if not started and now > start_deadline:
                fail_fn(
                    status,
                    pods,
                    f"pods did not all start within start_timeout_s={self.start_timeout_s}: {note}",
                )
            if now > deadline:
                fail_fn(status, pods, f"timed out after {self.timeout_s}s")
            time.sleep(self.poll_interval_s)

    def _say_preempted(self, log, api, what: str, job) -> None:
        ns, name = self.namespace, job.metadata.name
        why = kueue.eviction(kueue.workload_of(api, ns, job.metadata.uid))
        log.warning(
            f"{what} {ns}/{name} was preempted by Kueue"
            + (f" ({why})" if why else " (suspended after it started)")
            + ": its pods are stopped; the same Job waits for re-admission and resumes from its "
            "last checkpoint"
        )

    def failure_report(self, log, api, name: str, pods: Sequence[Any], unit: str = "node") -> str:
        """Copy each given pod's log tail (failed ones first) and the Warning events into the
        log; return them.
        """
        parts = []
        failed_first = sorted(pods, key=lambda p: (not _is_failed(p), _completion_index(p)))
        for pod in failed_first:
            tail = _safe_logs(api, pod.metadata.name, self.namespace, self.log_tail_lines)
            state = _pod_state(pod)
            log.error(
                f"Pod {pod.metadata.name} ({unit} {_completion_index(pod)}) {state}; last log "
                f"lines:\n{tail}"
            )
            parts.append(
                f"--- pod {pod.metadata.name} ({unit} {_completion_index(pod)}) {state} ---\n{tail}"
            )
        events = _warning_events(api, self.namespace, [name, *(p.metadata.name for p in pods)])
        if events:
            parts.append(f"--- events ---\n{events}")
        return "\n".join(parts)

    def _fail(self, log, api, name: str, pods: Sequence[Any], why: str) -> None:
        """A training gang failed: classify by evidence (``failures.py``'s table: exit codes,
        container reasons, log signatures) into resubmit (transient infrastructure, e.g. an NCCL
        timeout or a GPU Xid: :class:`GangDisrupted`, counted against max_resubmissions) or fail.
        """
        report = self.failure_report(log, api, name, pods)
        # only pods that failed on their own: not a timeout's or a deadline's kills
        own = why.startswith("pod(s) failed") or (
            why.startswith(("Job failed:", "JobSet failed:")) and "DeadlineExceeded" not in why
        )
        codes = _exit_codes(pods) if own else []
        head = f"training Job {self.namespace}/{name}: {why}"
        if codes:
            action, kind = classify_failure(codes, report)
            if action == RESUBMIT:
                raise GangDisrupted(f"{head} ({kind})")
            head += f" ({kind}; not retried)"
        raise TrainingFailed(head + "\n" + report)


def _exit_codes(pods: Sequence[Any]) -> list[tuple[int, str | None]]:
    """``(exit code, reason)`` of the trainer container of each failed pod."""
    out = []
    for p in pods:
        if not _is_failed(p):
            continue
        for cs in (p.status.container_statuses or []) if p.status else []:
            term = cs.state.terminated if cs.state else None
            if cs.name == CONTAINER_NAME and term is not None:
                out.append((term.exit_code, term.reason))
    return out
