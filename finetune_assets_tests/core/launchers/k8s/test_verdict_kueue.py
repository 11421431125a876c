"""The verdict under Kueue: terminal conditions before ``Suspended``; the pods a preemption killed
say nothing about the Job once Kueue re-admitted it (its new ``status.startTime``).

Statuses as the real Job controller writes them (see test_kueue_plane.py for the live run).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace as NS

from finetune_assets.core.launchers.k8s import assess

T0 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def cond(ctype: str, reason: str = "", message: str = "") -> NS:
    return NS(type=ctype, status="True", reason=reason, message=message)


def pod(name: str, phase: str, created: datetime, index: int = 0) -> NS:
    return NS(
        metadata=NS(
            name=name,
            creation_timestamp=created,
            annotations={"batch.kubernetes.io/job-completion-index": str(index)},
            labels={},
        ),
        status=NS(phase=phase, conditions=[], container_statuses=[], reason=None, message=None),
        spec=NS(node_name="n1"),
    )


def test_a_failed_job_that_also_reads_suspended_is_failed_not_queued() -> None:
    status = NS(
        conditions=[
            cond("Suspended", "JobSuspended", "Job suspended"),
            cond("Failed", "PodFailurePolicy", "Container trainer for pod x failed with exit 1"),
        ],
        start_time=None,
        succeeded=0,
    )
    verdict = assess(status, [], 2)
    assert verdict.kind == "failed"
    assert "PodFailurePolicy" in verdict.why


def test_a_complete_job_that_also_reads_suspended_is_complete() -> None:
    status = NS(conditions=[cond("Suspended"), cond("Complete")], start_time=None, succeeded=2)
    assert assess(status, [], 2).kind == "complete"


def test_pods_killed_by_a_preemption_do_not_fail_the_readmitted_job() -> None:
    killed = [pod(f"old-{i}", "Failed", T0, i) for i in range(2)]
    new = [pod(f"new-{i}", "Running", T0 + timedelta(seconds=40), i) for i in range(2)]
    status = NS(conditions=[], start_time=T0 + timedelta(seconds=39), succeeded=0)
    assert assess(status, killed + new, 2).kind == "running"
    # the same pods before any re-admission (startTime before them): a real failure
    status = NS(conditions=[], start_time=T0, succeeded=0)
    assert assess(status, killed + new, 2).kind == "failed"
