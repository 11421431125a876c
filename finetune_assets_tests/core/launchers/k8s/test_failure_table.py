"""Each row of the evidence table (core/launchers/k8s/failures.py): what a failed gang shows ->
what the
launcher does. Rows the plane cannot produce (a real Xid, an OOM on a GPU, a kubelet's emptyDir
eviction) are checked here with the messages the real components print; the plane covers the
CUDA preflight and NCCL rows end to end (test_gpu_and_failures_plane.py).
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from finetune_assets.core.launchers.k8s import assess
from finetune_assets.core.launchers.k8s.failures import FAIL, RESUBMIT, classify_failure

NCCL = (
    "[rank3]:[E ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 600035 milliseconds before timing out."
)


@pytest.mark.parametrize(
    ("codes", "logs", "action", "says"),
    [
        ([(1, "Error")], NCCL, RESUBMIT, "NCCL timeout"),
        (
            [(1, "Error")],
            "NCCL error: remote process exited or there was a network error",
            RESUBMIT,
            "NCCL",
        ),
        (
            [(1, "Error")],
            "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            RESUBMIT,
            "Xid",
        ),
        (
            [(1, "Error")],
            "RuntimeError: CUDA error: uncorrectable ECC error encountered",
            RESUBMIT,
            "ECC",
        ),
        ([(78, "Error")], "CUDA preflight failed: this pod was given 8 GPU(s)", FAIL, "no CUDA"),
        (
            [(1, "Error")],
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            FAIL,
            "GPU memory",
        ),
        ([(137, "OOMKilled")], "", FAIL, "OOMKilled"),
        ([(78, "Error")], "ConfigError: unknown field", FAIL, "EX_CONFIG"),
        ([(75, "Error")], "", RESUBMIT, "EX_TEMPFAIL"),
        ([(143, "Error")], "", RESUBMIT, "SIGTERM"),
        ([(1, "Error")], "ValueError: boom", FAIL, "training code failed (exit code(s) [1])"),
    ],
)
def test_row(codes, logs: str, action: str, says: str) -> None:
    got, why = classify_failure(codes, logs)
    assert (got, says in why) == (action, True), why


def evicted(message: str) -> NS:
    return NS(
        metadata=NS(name="p-0", creation_timestamp=None, annotations={}, labels={}),
        status=NS(
            phase="Failed",
            reason="Evicted",
            message=message,
            conditions=[
                NS(
                    type="DisruptionTarget",
                    status="True",
                    reason="TerminationByKubelet",
                    message="",
                )
            ],
            container_statuses=[],
        ),
    )


def test_an_emptydir_limit_eviction_fails_it_is_not_infrastructure() -> None:
    # kubelet's words (pkg/kubelet/eviction/helpers.go: emptyDirMessageFmt)
    pod = evicted('Usage of EmptyDir volume "tmp" exceeds the limit "8Gi". ')
    verdict = assess(NS(conditions=[], start_time=None, succeeded=0), [pod], 1)
    assert verdict.kind == "failed" and "raise scratch_size" in verdict.why


def test_a_node_pressure_eviction_is_resubmitted() -> None:
    pod = evicted("The node was low on resource: memory. ")
    assert assess(NS(conditions=[], start_time=None, succeeded=0), [pod], 1).kind == "disrupted"
