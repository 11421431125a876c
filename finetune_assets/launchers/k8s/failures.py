"""Infrastructure or code? The failure classifier, as tables (deploy/README.md shows them too).

Infrastructure failures are the cluster's doing and are resubmitted (a training gang: a fresh gang
that resumes from the checkpoint; a fan-out index: the Job controller's per-index retry). Code and
configuration failures would repeat, so they fail the run at once with the pod's log tail.
"""

from __future__ import annotations

import re

# A Failed pod's ``status.reason`` that means the node or kubelet ended it, not the code. Set when
# there is no DisruptionTarget condition (which the launcher always treats as a disruption).
INFRA_POD_REASONS = {
    "Evicted": "kubelet eviction: node pressure, or an emptyDir / ephemeral-storage limit",
    "UnexpectedAdmissionError": "kubelet admission failed (e.g. a device plugin restarted)",
    "NodeAffinity": "the node's labels no longer match after it restarted",
    "NodeShutdown": "graceful node shutdown",
    "Terminated": "graceful node shutdown (older kubelets)",
    "Shutdown": "graceful node shutdown (older kubelets)",
    "DeadlineExceeded": None,  # the Job's own deadline: not infrastructure (listed to say so)
}
# kubelet admission: OutOfcpu, OutOfmemory, OutOfnvidia.com/gpu
INFRA_POD_REASON_PREFIXES = ("OutOf",)

# Container waiting reasons: the kubelet retries these itself (back-off), so the launcher keeps
# waiting within start_timeout_s, unless the message says the image or config cannot ever work.
TRANSIENT_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerError",
    "ContainerCreating",
    "PodInitializing",
}
FATAL_WAITING = {"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"}
PERMANENT_PULL = re.compile(
    r"not found|manifest unknown|name unknown|unauthorized|authentication required|access "
    r"denied|denied|"
    r"invalid reference format",
    re.I,
)

# Exit codes (fan-out podFailurePolicy): counted against the index's retries instead of failing it.
OOM_EXIT_CODE = 137  # 128 + SIGKILL: OOM-killed, or killed by the kubelet / runtime
TRANSIENT_EXIT_CODE = (
    75  # EX_TEMPFAIL: a worker's transient I/O error (data/slices.py exits with it)
)
RETRIED_EXIT_CODES = (TRANSIENT_EXIT_CODE, OOM_EXIT_CODE)


def infrastructure_reason(pod) -> str | None:
    """Why a Failed pod is the cluster's doing (its ``status.reason`` explained), or None."""
    status = pod.status
    if status is None or status.phase != "Failed" or not status.reason:
        return None
    reason = status.reason
    known = INFRA_POD_REASONS.get(reason)
    if known is None and not reason.startswith(INFRA_POD_REASON_PREFIXES):
        return None
    what = known or "kubelet admission: the node lacks the resource"
    return f"{reason} ({what}): {status.message or ''}".rstrip(": ")


def waiting_is_fatal(reason: str | None, message: str | None) -> bool:
    """A container waiting reason that will not fix itself (see the tables above)."""
    if reason in FATAL_WAITING:
        return True
    if reason in ("ErrImagePull", "ImagePullBackOff"):
        return bool(PERMANENT_PULL.search(message or ""))
    return False
