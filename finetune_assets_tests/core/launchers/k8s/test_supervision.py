"""The supervision verdict on Job and Pod JSON in the shapes a real API server returns (see
recorded/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes
import pytest

from finetune_assets.core.launchers.k8s import assess

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
