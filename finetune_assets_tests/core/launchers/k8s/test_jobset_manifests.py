"""The JobSet backend's rendering and verdict, without a cluster (the plane's
``test_jobset_plane.py`` runs it against the real JobSet controller, CRD schema and webhooks).
"""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes import client as k8s

from finetune_assets.core.launchers import TrainingSpec
from finetune_assets.core.launchers.k8s.constants import GANG_LABEL, JOB_LABEL, QUEUE_LABEL
from finetune_assets.core.launchers.k8s.jobset import (
    EXCLUSIVE_KEY,
    RESTART_LABEL,
    assess_jobset,
    child_job,
    pod0_host,
)
from finetune_assets.core.training.checkpoints.fencing import GENERATION_ENV
from finetune_assets.defs.resources.k8s_launcher import K8sTorchrunLauncher

SPEC = TrainingSpec(
    name="trained-v1",
    config_url="s3://bucket/run.yaml",
    labels={"dagster/asset": "trained", "dagster/partition": "v1", "dagster/run-id": "r1"},
)


def launcher(**fields) -> K8sTorchrunLauncher:
    return K8sTorchrunLauncher(
        image="img:1", namespace="ml", load_incluster_config=False, backend="jobset", **fields
    )


def test_the_jobset_wraps_the_indexed_job_and_restarts_the_gang_server_side() -> None:
    js = launcher(nnodes=2, jobset_max_restarts=2, queue_name="research").render_jobset(
        SPEC, "trained-v1-abc123", generation=1700
    )
    (rjob,) = js["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert rjob["replicas"] == 1 and job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == 2 and job["backoffLimit"] == 0
    # any failed pod, a disrupted one too, fails the child Job: the JobSet then restarts them all
    actions = [
        (r["action"], r.get("onPodConditions"), r.get("onExitCodes"))
        for r in job["podFailurePolicy"]["rules"]
    ]
    assert all(a == "FailJob" for a, _, _ in actions)
    assert [{"type": "DisruptionTarget", "status": "True"}] in [c for _, c, _ in actions]
    policy = js["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 2 and policy["restartStrategy"] == "BlockingRecreate"
    # a timeout and a configuration error (exit 78) are never restarted
    assert [r["action"] for r in policy["rules"]] == ["FailJobSet", "FailJobSet"]
    message = "Container trainer for pod ml/p-0 failed with exit code 78 matching FailJob rule"
    import re

    assert re.search(policy["rules"][1]["onJobFailureMessagePatterns"][0], message)
    assert not re.search(policy["rules"][1]["onJobFailureMessagePatterns"][0], message[:-30] + "1 ")
    # the JobSet's own headless Service; pod 0 at <jobset>-node-0-0.<jobset>
    assert js["spec"]["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    (container,) = job["template"]["spec"]["containers"]
    assert f"e={pod0_host('trained-v1-abc123', 'ml')}:29400" in container["command"][2]
    assert (
        pod0_host("trained-v1-abc123", "ml")
        == "trained-v1-abc123-node-0-0.trained-v1-abc123.ml.svc"
    )
    # Kueue admits the JobSet whole: the queue label on it only, never on the child Job
    assert js["metadata"]["labels"][QUEUE_LABEL] == "research" and js["spec"]["suspend"] is True
    assert QUEUE_LABEL not in rjob["template"]["metadata"]["labels"]
    assert QUEUE_LABEL not in job["template"]["metadata"]["labels"]
    assert "suspend" not in job and "ttlSecondsAfterFinished" not in job
    # pods keep the launcher's labels (its pod queries, the gang key)
    pod_labels = job["template"]["metadata"]["labels"]
    assert pod_labels[JOB_LABEL] == "trained-v1-abc123" and GANG_LABEL in pod_labels


def test_each_restart_is_a_new_fencing_generation() -> None:
    js = launcher(nnodes=2).render_jobset(SPEC, "trained-v1-abc123", generation=1700)
    env = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "env"
    ]
    names = [e["name"] for e in env]
    restart = env[names.index("FINETUNE_JOBSET_RESTART")]
    assert restart["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{RESTART_LABEL}']"
    # defined after the variable it expands (the kubelet expands only earlier ones)
    assert names.index(GENERATION_ENV) > names.index("FINETUNE_JOBSET_RESTART")
    assert env[names.index(GENERATION_ENV)]["value"] == "1700$(FINETUNE_JOBSET_RESTART)"
    # one digit per restart: every restart of a later launch is above every one of this launch
    assert int("1700" + "9") < int("1701" + "0")


@pytest.mark.parametrize("version", ["1.31", "1.35"])
def test_the_child_job_validates_as_a_job(version: str) -> None:
    js = launcher(nnodes=4, gpus_per_node=8, exclusive_topology="kubernetes.io/hostname")
    body = js.render_jobset(SPEC, "trained-v1-abc123", generation=1)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": child_job("trained-v1-abc123"), "namespace": "ml"},
        "spec": body["spec"]["replicatedJobs"][0]["template"]["spec"],
    }
    kubernetes_validate.validate(job, version, strict=True)
    assert body["metadata"]["annotations"] == {EXCLUSIVE_KEY: "kubernetes.io/hostname"}


def test_generated_names_fit_what_the_jobset_webhook_allows() -> None:
    """JobSet refuses a JobSet whose child Job or pod hostnames would exceed 63 characters."""
    from finetune_assets.core.launchers.k8s.manifests import k8s_name

    name = k8s_name("x" * 200)
    assert len(f"{child_job(name)}-{7}") <= 63


def test_exclusive_placement_needs_the_jobset_backend() -> None:
    with pytest.raises(ValueError, match="needs backend='jobset'"):
        K8sTorchrunLauncher(image="i", exclusive_topology="kubernetes.io/hostname")
    with pytest.raises(ValueError):
        launcher(jobset_max_restarts=10)  # one digit of the fencing generation


def _pod(index: int, phase: str, exit_code: int | None = None) -> k8s.V1Pod:
    term = None if exit_code is None else k8s.V1ContainerStateTerminated(exit_code=exit_code)
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name=f"p-{index}", annotations={"batch.kubernetes.io/job-completion-index": str(index)}
        ),
        spec=k8s.V1PodSpec(containers=[], node_name="n1"),
        status=k8s.V1PodStatus(
            phase=phase,
            container_statuses=[
                k8s.V1ContainerStatus(
                    name="trainer",
                    image="img:1",
                    image_id="",
                    ready=phase == "Running",
                    restart_count=0,
                    state=k8s.V1ContainerState(terminated=term),
                )
            ],
        ),
    )


def _jobset(conditions=(), restarts: int = 0) -> dict:
    return {
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conditions
            ],
            "restarts": restarts,
            "restartsCountTowardsMax": restarts,
        }
    }


@pytest.mark.parametrize(
    ("obj", "pods", "kind"),
    [
        (_jobset(), [_pod(0, "Running"), _pod(1, "Running")], "running"),
        (_jobset(), [_pod(0, "Running")], "waiting"),
        # a failed pod while restarts are left: the controller restarts the gang, not final
        (_jobset(restarts=1), [_pod(0, "Running"), _pod(1, "Failed", 137)], "restarting"),
        # none left: fail fast, before the controller's Failed
        (_jobset(restarts=2), [_pod(0, "Running"), _pod(1, "Failed", 137)], "failed"),
        # the JobSet's terminal conditions decide over the pods
        (_jobset([("Completed", "AllJobsCompleted", "")]), [], "complete"),
        (_jobset([("Failed", "ReachedMaxRestarts", "m")]), [_pod(0, "Running")], "failed"),
        (_jobset([("Suspended", "SuspendedJobs", "")]), [], "queued"),
    ],
)
def test_the_verdict_reads_the_jobset_and_its_current_pods(obj, pods, kind) -> None:
    assert assess_jobset(obj, pods, nnodes=2, max_restarts=2).kind == kind
