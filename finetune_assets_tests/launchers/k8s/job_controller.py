"""TEST DOUBLE of the Kubernetes Job controller's verdict: one ``syncJob`` pass as a pure function.

Fakes: what ``pkg/controller/job`` decides from a Job spec and its pods for Indexed Jobs (and
non-indexed ones with one pod per slot): ``backoffLimit`` (checked whatever
``backoffLimitPerIndex`` says), ``backoffLimitPerIndex`` with the ``job-index-failure-count``
annotation, ``maxFailedIndexes``, ``podFailurePolicy`` (first matching rule wins; actions Ignore,
Count, FailJob, FailIndex; ``onExitCodes`` with ``containerName``, init containers first, exit
code 0 never matches; ``onPodConditions``), ``suspend``, and the interim ``FailureTarget`` /
``SuccessCriteriaMet`` conditions with the terminal ones delayed while pods terminate (the
defaults since Kubernetes 1.31: JobPodReplacementPolicy, JobManagedBy and JobSuccessPolicy on).
Active pods of a failing Job are terminated and counted as failed, as upstream does.

Not faked: ``successPolicy``, ``podReplacementPolicy: TerminatingOrFailed``, the exponential
back-off before a replacement pod, expectations, finalizers and ``uncountedTerminatedPods``,
non-indexed work queues. The rules come from the upstream tests transcribed in
``upstream_job_cases.py`` (each case names its upstream test), which this model must pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_INT32 = 2**31 - 1
DEFAULT_BACKOFF_LIMIT = 6  # the API default without backoffLimitPerIndex
COMPLETIONS_REACHED = ("CompletionsReached", "Reached expected number of succeeded pods")
BACKOFF = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
MAX_FAILED = (
    "MaxFailedIndexesExceeded",
    "Job has exceeded the specified maximal number of failed indexes",
)
FAILED_INDEXES = ("FailedIndexes", "Job has failed indexes")
DEADLINE = ("DeadlineExceeded", "Job was active longer than specified deadline")


@dataclass
class Pod:
    """What the controller reads from one pod."""

    name: str
    index: int
    phase: str  # Pending | Running | Succeeded | Failed
    exit_codes: dict[str, int] = field(default_factory=dict)  # container -> terminated exit code
    init_exit_codes: dict[str, int] = field(default_factory=dict)
    conditions: tuple[str, ...] = ()  # pod condition types that are True (e.g. DisruptionTarget)
    failure_count: int = 0  # annotation batch.kubernetes.io/job-index-failure-count
    deleting: bool = False  # metadata.deletionTimestamp set


@dataclass
class Status:
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    terminating: int = 0
    completed_indexes: str = ""
    failed_indexes: str | None = None  # only with backoffLimitPerIndex
    conditions: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    to_create: list[int] = field(default_factory=list)  # indexes that get a new pod
    to_delete: list[str] = field(default_factory=list)  # pods the controller terminates


def backoff_limit(spec: dict[str, Any]) -> int:
    """The API server's default: 2147483647 with ``backoffLimitPerIndex``, else 6."""
    if "backoffLimit" in spec:
        return int(spec["backoffLimit"])
    return MAX_INT32 if spec.get("backoffLimitPerIndex") is not None else DEFAULT_BACKOFF_LIMIT


def failure_action(spec: dict[str, Any], pod: Pod, ns: str = "default") -> tuple[str, str]:
    """The first ``podFailurePolicy`` rule for a failed pod: (action, message); Count if none."""
    for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules", [])):
        codes = rule.get("onExitCodes")
        if codes:
            wanted = set(codes["values"])
            for cname, code in [*pod.init_exit_codes.items(), *pod.exit_codes.items()]:
                if code == 0 or codes.get("containerName") not in (None, cname):
                    continue
                if (code in wanted) == (codes["operator"] == "In"):
                    return rule["action"], (
                        f"Container {cname} for pod {ns}/{pod.name} failed with exit code "
                        f"{code} matching {rule['action']} rule at index {i}"
                    )
        for pattern in rule.get("onPodConditions") or []:
            if pattern["type"] in pod.conditions and pattern.get("status", "True") == "True":
                return rule["action"], (
                    f"Pod {ns}/{pod.name} has condition {pattern['type']} matching "
                    f"{rule['action']} rule at index {i}"
                )
    return "Count", ""


def sync(
    spec: dict[str, Any], pods: list[Pod], ns: str = "default", past_deadline: bool = False
) -> Status:
    """One reconcile of an Indexed Job: its status, the pods to create and to delete."""
    completions = int(spec.get("completions") or 1)
    parallelism = int(spec.get("parallelism", 1))
    per_index = spec.get("backoffLimitPerIndex")
    st = Status()
    completed: set[int] = set()
    failed_idx: set[int] = set()
    finish: tuple[str, str] | None = None
    holding: set[int] = set()  # indexes with a live or still-terminating pod
    for pod in pods:
        if pod.phase == "Succeeded":
            st.succeeded += 1
            completed.add(pod.index)
        elif pod.phase == "Failed":
            action, message = (
                failure_action(spec, pod, ns) if spec.get("podFailurePolicy") else ("Count", "")
            )
            if pod.deleting:
                holding.add(pod.index)  # the replacement waits until the failed pod is gone
            if action == "Ignore":
                continue
            st.failed += 1
            if action == "FailJob" and finish is None:
                finish = ("PodFailurePolicy", message)
            elif per_index is not None and (
                action == "FailIndex" or pod.failure_count + 1 > int(per_index)
            ):
                failed_idx.add(pod.index)
        elif pod.deleting:
            holding.add(pod.index)  # terminating: neither active nor failed yet
        else:
            holding.add(pod.index)
    live = [p for p in pods if p.phase in ("Pending", "Running") and not p.deleting]
    if finish is None and st.failed > backoff_limit(spec):
        finish = BACKOFF
    if (
        finish is None
        and per_index is not None
        and spec.get("maxFailedIndexes") is not None
        and len(failed_idx) > int(spec["maxFailedIndexes"])
    ):
        finish = MAX_FAILED
    if finish is None and past_deadline:
        finish = DEADLINE
    st.completed_indexes = _ranges(completed)
    if per_index is not None:
        st.failed_indexes = _ranges(failed_idx)
    if finish is None and failed_idx and len(completed | failed_idx) >= completions:
        finish = FAILED_INDEXES
    if finish is not None:  # terminate the rest; they count as failed; Failed once they are gone
        st.to_delete = [p.name for p in live]
        st.failed += len(live)
        st.terminating = len(live)
        st.conditions.append(("FailureTarget", *finish))
        if not live:
            st.conditions.append(("Failed", *finish))
        return st
    if len(completed) >= completions:
        st.conditions += [
            ("SuccessCriteriaMet", *COMPLETIONS_REACHED),
            ("Complete", *COMPLETIONS_REACHED),
        ]
        return st
    if spec.get("suspend"):
        st.to_delete = [p.name for p in live]
        st.conditions.append(("Suspended", "JobSuspended", "Job suspended"))
        return st
    todo = [i for i in range(completions) if i not in completed | failed_idx | holding]
    st.to_create = todo[: max(0, parallelism - len(live))]
    st.active = len(live) + len(st.to_create)
    return st


def _ranges(done: set[int]) -> str:
    """``{0, 1, 3, 4, 5}`` -> ``"0,1,3-5"``: ``orderedIntervals.String`` in ``indexed_job_utils.go``
    (two neighbours are written with a comma, three or more as a range).
    """
    runs: list[list[int]] = []
    for i in sorted(done):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a},{b}" if b == a + 1 else f"{a}-{b}" for a, b in runs)
