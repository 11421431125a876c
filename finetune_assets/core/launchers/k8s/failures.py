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
    75  # EX_TEMPFAIL: a worker's transient I/O error (core/shards/slices.py exits with it)
)
RETRIED_EXIT_CODES = (TRANSIENT_EXIT_CODE, OOM_EXIT_CODE)


# -- the evidence table: what a failed training pod shows -> what the launcher does ----------------
# Checked in order, first match wins; ``resubmit`` = a fresh gang from the checkpoint, counted
# against max_resubmissions (the bounded budget for transient infrastructure); ``fail`` = the run
# fails at once with the pod's log tail (it would fail again). deploy/README.md shows the table.
RESUBMIT, FAIL = "resubmit", "fail"

# kubelet evictions for a size limit the pod itself set: deterministic, a resubmission repeats it
LIMIT_EVICTION = re.compile(
    r"Usage of EmptyDir volume .* exceeds the limit|exceeded its local ephemeral storage limit|"
    r"ephemeral local storage usage exceeds the total limit",
    re.I,
)
# (pattern over the failed pods' log tails, action, why), most specific first
LOG_SIGNATURES: list[tuple[re.Pattern[str], str, str]] = [
    (
        re.compile(r"CUDA preflight failed"),
        FAIL,
        "configuration: a pod given GPUs sees no CUDA device (image or driver path)",
    ),
    (
        re.compile(r"CUDA out of memory|torch\.OutOfMemoryError", re.I),
        FAIL,
        "configuration: GPU memory (batch size, sequence length or model too large)",
    ),
    (
        re.compile(
            r"Watchdog caught collective operation timeout|NCCL (?:communicator|operation).*"
            r"(?:timed? ?out|Timeout)|ProcessGroupNCCL.*(?:timed? ?out|Timeout)|NCCL.*"
            r"(?:remote process exited|unhandled system error|Connection reset)",
            re.I,
        ),
        RESUBMIT,
        "transient: NCCL timeout or connection loss (a peer, a link or the fabric stalled)",
    ),
    (
        re.compile(
            r"\bXid\b|uncorrectable ECC error|GPU (?:is lost|has fallen off the bus)|"
            r"CUDA error: (?:unspecified launch failure|an illegal instruction)",
            re.I,
        ),
        RESUBMIT,
        "transient infrastructure: GPU hardware fault (CUDA Xid / ECC); resubmitted, the "
        "scheduler may pick another node",
    ),
]
# exit codes of the trainer container (after the log signatures)
EXIT_CODE_ACTIONS: dict[int, tuple[str, str]] = {
    78: (FAIL, "configuration error (EX_CONFIG)"),
    75: (RESUBMIT, "transient I/O error (EX_TEMPFAIL)"),
    143: (RESUBMIT, "SIGTERM from outside the trainer (node or runtime), no disruption recorded"),
}


def classify_failure(exit_codes: list[tuple[int, str | None]], logs: str) -> tuple[str, str]:
    """``(action, why)`` for a failed gang from its failed containers' ``(exit code, reason)``
    and log tails; default: the code's failure (``fail``).
    """
    for _code, reason in exit_codes:
        if reason == "OOMKilled":
            return FAIL, "configuration: the container exceeded its memory limit (OOMKilled)"
    for pattern, action, why in LOG_SIGNATURES:
        if pattern.search(logs):
            return action, why
    for code, _ in exit_codes:
        if code in EXIT_CODE_ACTIONS:
            action, why = EXIT_CODE_ACTIONS[code]
            return action, f"exit code {code}: {why}"
    codes = sorted({c for c, _ in exit_codes})
    return FAIL, f"the training code failed (exit code(s) {codes or '?'})"


def limit_eviction(pod) -> str | None:
    """A kubelet eviction for the pod's own size limit (emptyDir ``sizeLimit``, ephemeral
    storage): not infrastructure, a resubmission would be evicted again.
    """
    status = pod.status
    message = (status.message or "") if status else ""
    if status is not None and status.reason == "Evicted" and LIMIT_EVICTION.search(message):
        return (
            f"evicted for its own size limit ({message}): raise scratch_size (the /tmp and "
            "/cache emptyDirs) or write less there; not retried"
        )
    return None


def infrastructure_reason(pod) -> str | None:
    """Why a Failed pod is the cluster's doing (its ``status.reason`` explained), or None."""
    status = pod.status
    if status is None or status.phase != "Failed" or not status.reason:
        return None
    if limit_eviction(pod):
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
