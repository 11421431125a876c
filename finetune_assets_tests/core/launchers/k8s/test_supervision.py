"""The supervision verdict on Job and Pod JSON in the shapes a real API server returns (see
recorded/README.md).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import kubernetes
import pytest

from finetune_assets.core.launchers.k8s import assess
from finetune_assets.core.launchers.k8s.verdict import VanishedPods, ended_on_purpose

RECORDED = Path(__file__).parent / "recorded"


def load(case: str):
    data = json.loads((RECORDED / f"{case}.json").read_text())
    client = kubernetes.client.ApiClient()
    job = client._ApiClient__deserialize(data["job"], "V1Job")
    pods = client._ApiClient__deserialize(data["pods"], "V1PodList").items
    return job.status, pods


@pytest.mark.parametrize(
    ("case", "kind", "says"),
    [
        # the peer failed because pod 1 was evicted: a disruption (resubmit), not a code failure
        (
            "evicted",
            "disrupted",
            "ft-abc123-1-x7k2p: EvictionByEvictionAPI: Eviction API: evicting",
        ),
        ("taint_manager", "disrupted", "DeletionByTaintManager"),
        # fail fast on the failed pod, before the controller's Failed
        (
            "failjob",
            "failed",
            "pod(s) failed",
        ),
        ("deadline", "failed", "DeadlineExceeded"),
        ("image_pull", "stuck", "ErrImagePull: rpc error: code = NotFound"),
        (
            "unschedulable",
            "waiting",
            "ft-abc123-0-q9w8e: Unschedulable: 0/4 nodes are available: 4 Insufficient "
            "nvidia.com/gpu",
        ),
        ("no_pods", "waiting", "2 of 2 pod(s) not created"),
        (
            "node_not_ready",
            "running",
            "ft-abc123-1-x7k2p: not Ready (NodeNotReady): Node is not ready",
        ),
        ("complete", "complete", ""),
    ],
)
def test_verdict(case: str, kind: str, says: str) -> None:
    status, pods = load(case)
    verdict = assess(status, pods, nnodes=2)
    assert verdict.kind == kind and says in verdict.why + verdict.reason, verdict


def test_deadline_is_named_as_such() -> None:
    status, pods = load("deadline")
    assert assess(status, pods, nnodes=2).reason == "DeadlineExceeded"


@pytest.mark.parametrize(
    ("reason", "message", "fatal"),
    [
        ("ErrImagePull", "rpc error: code = NotFound desc = manifest unknown", True),
        (
            "ErrImagePull",
            "429 Too Many Requests: toomanyrequests: You have reached your pull rate limit",
            False,
        ),
        (
            "ImagePullBackOff",
            "Back-off pulling image: received unexpected HTTP status: 503 Service Unavailable",
            False,
        ),
        (
            "ImagePullBackOff",
            "pull access denied, repository does not exist or may require authorization",
            True,
        ),
        # the runtime hiccupped: the kubelet retries
        (
            "CreateContainerError",
            "context deadline exceeded",
            False,
        ),
        ("CreateContainerConfigError", 'secret "finetune-s3" not found', True),
        ("InvalidImageName", "couldn't parse image reference", True),
    ],
)
def test_which_waits_are_fatal(reason: str, message: str, fatal: bool) -> None:
    from finetune_assets.core.launchers.k8s.failures import waiting_is_fatal

    assert waiting_is_fatal(reason, message) is fatal


def _pending_pod(spec: dict, status: dict):
    body = {"metadata": {"name": "p"}, "spec": {"containers": [], **spec}, "status": status}
    return kubernetes.client.ApiClient()._ApiClient__deserialize(body, "V1Pod")


@pytest.mark.parametrize(
    ("spec", "status", "says"),
    [
        # the scheduler's condition, as kube-scheduler writes it for a gang that does not fit
        (
            {},
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                    }
                ],
            },
            "not scheduled: Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        ),
        (
            {"schedulingGates": [{"name": "kueue.x-k8s.io/topology"}]},
            {"phase": "Pending"},
            "held by scheduling gates ['kueue.x-k8s.io/topology']",
        ),
        ({}, {"phase": "Pending"}, "no scheduler has tried"),
        (
            {"nodeName": "gpu-7"},
            {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "image": "i",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "ContainerCreating"}},
                    }
                ],
            },
            "on node gpu-7, not started (trainer: ContainerCreating)",
        ),
    ],
)
def test_a_pending_pod_in_a_failure_report_says_where_it_is_stuck(spec, status, says) -> None:
    from finetune_assets.core.launchers.k8s.verdict import _pod_state

    assert says in _pod_state(_pending_pod(spec, status))


def test_a_running_pod_deleted_between_two_polls_is_a_disruption() -> None:
    """The Eviction API deletes pod 1; its trainer stops at SIGTERM within a second and the Job
    controller (podFailurePolicy ``Ignore``) drops it and makes a new one before the next poll:
    that poll shows nothing that says ``DisruptionTarget`` (``assess`` alone would wait for the
    new pod while pod 0 hangs or fails), so the pod's absence has to say it.
    """
    status, pods = load("node_not_ready")  # pods 0 and 1 Running
    vanished = VanishedPods()
    assert vanished.update(pods) == []
    pod0 = [p for p in pods if p.metadata.name == "ft-abc123-0-q9w8e"]
    assert assess(status, pod0, 2).kind == "waiting"
    assert vanished.update(pod0) == [
        "pod ft-abc123-1-x7k2p (index 1) was deleted while it ran, before a poll saw why "
        "(an eviction, a preemption or a drained node)"
    ]
    assert vanished.update(pod0) == []  # said once


def test_pods_that_finished_or_were_seen_being_deleted_are_not_reported_gone() -> None:
    """A finished pod stays listed until the Job is deleted; a pod seen with a deletion timestamp
    shows why itself (``DisruptionTarget``) or was deleted by the Job's own suspension.
    """
    _, pods = load("node_not_ready")
    vanished = VanishedPods()
    pods[0].status.phase = "Succeeded"
    pods[1].metadata.deletion_timestamp = datetime.datetime(
        2026, 11, 29, 21, 20, tzinfo=datetime.UTC
    )
    vanished.update(pods)
    assert vanished.update([]) == []


def test_a_suspended_or_finished_job_deletes_its_pods_on_purpose() -> None:
    job = kubernetes.client.V1Job(
        spec=kubernetes.client.V1JobSpec(template={}, suspend=False),
        status=kubernetes.client.V1JobStatus(conditions=[]),
    )
    assert not ended_on_purpose(job)
    job.spec.suspend = True  # Kueue evicted the Workload: the Job controller deletes the pods
    assert ended_on_purpose(job)
    job.spec.suspend = False
    for ctype in ("FailureTarget", "Failed", "Complete", "Suspended"):
        job.status.conditions = [kubernetes.client.V1JobCondition(type=ctype, status="True")]
        assert ended_on_purpose(job), ctype
    job.status.conditions = [kubernetes.client.V1JobCondition(type="Failed", status="False")]
    assert not ended_on_purpose(job)
