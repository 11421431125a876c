"""The k8s launcher end to end against a Kubernetes API: Dagster run -> launcher -> API -> pods ->
torchrun.

Runs on the local control plane (docs/k8s-control-plane.md) and against a real cluster when
KUBECONFIG and FINETUNE_K8S_TEST_IMAGE are set (see conftest.py and deploy/README.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
import uuid

import pytest
from dagster._core.errors import DagsterExecutionInterruptedError

from finetune_assets.core.launchers import TrainingSpec
from finetune_assets_tests.core.launchers.k8s.conftest import Cluster, free_port
from finetune_assets_tests.core.launchers.k8s.helpers import launch_in_dagster
from finetune_assets_tests.core.launchers.k8s.plane import audit_events, wait_until

pytestmark = pytest.mark.k8s

# The JobSet backend's (test_jobset_plane.py runs it as deploy/rbac.yaml's ServiceAccount).
JOBSET_VERBS = {
    ("create", "jobsets"),
    ("get", "jobsets"),
    ("list", "jobsets"),
    ("delete", "jobsets"),
    ("patch", "jobsets"),
}
# Exactly the (verb, resource) pairs the launcher calls; deploy/rbac.yaml must grant these and no
# more.
LAUNCHER_VERBS = JOBSET_VERBS | {
    ("create", "services"),
    ("delete", "services"),
    ("create", "jobs"),
    ("get", "jobs"),
    ("list", "jobs"),
    ("delete", "jobs"),
    ("patch", "jobs"),
    ("list", "pods"),
    ("get", "pods"),
    ("get", "pods/log"),
    ("list", "events"),
    ("list", "workloads"),
    ("patch", "workloads"),
}
# Called only when a delete keeps failing (test_api_faults covers it): suspend the Job instead (a
# Kueue Job: deactivate its Workload); Workloads are read only when Kueue preempted the gang.
FALLBACK_VERBS = {("patch", "jobs"), ("list", "workloads"), ("patch", "workloads")}


def _port(cluster: Cluster) -> int:
    return 29400  # torchrun's default: pods have addresses of their own


def test_one_node_succeeds_streams_logs_and_cleans_up(cluster: Cluster, instance) -> None:
    launched = launch_in_dagster(cluster.launcher(nnodes=1), "standin:ok", instance)
    assert launched.success, launched.logs
    # rank-0 pod log streamed
    assert re.search(r"\[\S+-0-\w+\] standin: node=0 rank=0 world=1", launched.logs)
    assert f"Deleted Job {cluster.namespace}/{launched.job_name}" in launched.logs
    assert cluster.leftovers(launched.job_name) == {}


def test_two_nodes_rendezvous_through_the_headless_service(cluster: Cluster, instance) -> None:
    """2 pods x 1 process: torchrun c10d rendezvous on pod 0's DNS name, then a gloo all_reduce."""
    launched = launch_in_dagster(
        cluster.launcher(nnodes=2, rdzv_port=_port(cluster)), "standin:allreduce", instance
    )
    assert launched.success, launched.logs
    assert "standin: allreduce=3 world=2" in launched.logs  # (0+1) + (1+1) across both pods
    assert "--node-rank $(JOB_COMPLETION_INDEX)" in launched.logs
    assert f"Deleted Service {cluster.namespace}/{launched.job_name}" in launched.logs
    assert cluster.leftovers(launched.job_name) == {}


def test_a_failed_pod_fails_the_run_fast_with_its_log(cluster: Cluster, instance) -> None:
    """Node 1 exits 3 while node 0 hangs: the run fails at once, with node 1's error, and cleans
    up.
    """
    launched = launch_in_dagster(
        cluster.launcher(nnodes=2, rdzv_port=_port(cluster), timeout_s=300),
        "standin:fail-node=1",
        instance,
    )
    assert not launched.success
    assert "boom on node 1" in launched.logs  # the failed pod's log tail reached the Dagster run
    # torchrun: a worker failed
    assert "pod(s) failed" in launched.logs and "exit code 1" in launched.logs
    for node in (0, 1):  # every pod's tail is kept, not only the failed one's
        assert re.search(rf"--- pod \S+-{node}-\w+ \(node {node}\)", launched.logs), launched.logs[
            -3000:
        ]
    # a failure of the training code itself is never resubmitted (only disruptions are)
    assert (
        "resubmitting" not in launched.logs and launched.logs.count("Launching training Job") == 1
    )
    assert launched.seconds < 60, "must not wait for the hung peer or the timeout"
    assert cluster.leftovers(launched.job_name) == {}


def test_timeout_fails_and_cleans_up(cluster: Cluster, instance) -> None:
    launched = launch_in_dagster(
        cluster.launcher(nnodes=1, timeout_s=8), "standin:sleep=600", instance
    )
    assert not launched.success
    assert "timed out after 8s" in launched.logs
    assert cluster.leftovers(launched.job_name) == {}


class _InterruptingLog:
    """A context.log that raises the way Dagster interrupts a step, once the trainer is running."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _log(self, msg: str) -> None:
        self.lines.append(msg)
        if "standin: sleeping" in msg:
            raise DagsterExecutionInterruptedError("run terminated by the user")

    info = debug = warning = error = _log


class _Context:
    def __init__(self) -> None:
        self.log = _InterruptingLog()
        self.run_id = str(uuid.uuid4())


def test_interruption_deletes_the_job(cluster: Cluster) -> None:
    context = _Context()
    with pytest.raises(DagsterExecutionInterruptedError):
        cluster.launcher(nnodes=1).launch(
            context, TrainingSpec(name="interrupted", config_url="standin:sleep=600")
        )
    name = re.search(r"Launching training Job [^/]+/(\S+):", "\n".join(context.log.lines)).group(1)
    assert any(
        line.startswith(f"Deleted Job {cluster.namespace}/{name}") for line in context.log.lines
    )
    assert cluster.leftovers(name) == {}


def test_killed_worker_is_restarted_by_torchrun(cluster: Cluster, instance) -> None:
    """SIGKILL of node 1's worker: torchrun (--max-restarts 1) restarts the group and the run
    succeeds.
    """
    launched = launch_in_dagster(
        cluster.launcher(nnodes=2, rdzv_port=_port(cluster), max_restarts=1),
        "standin:selfkill-node=1,allreduce",
        instance,
    )
    assert launched.success, launched.logs
    # pod 0's worker ran twice: torchrun on node 0 restarted its group when node 1 re-joined
    assert len(re.findall(r"standin: node=0 rank=\d+ world=2", launched.logs)) == 2, launched.logs
    assert "standin: allreduce=3 world=2" in launched.logs
    assert cluster.leftovers(launched.job_name) == {}


def test_killed_node_fails_the_run_clearly(cluster: Cluster, instance) -> None:
    """SIGKILL of node 1's torchrun agent (the pod's main process): the pod dies with 137, the run
    fails.

    The worker can kill its agent because torchrun is not PID 1 (``shareProcessNamespace``: the
    pause container is); as PID 1 of its namespace the kernel would ignore the signal, on a real
    node and in the node agent's per-pod PID namespace alike.
    """
    launched = launch_in_dagster(
        cluster.launcher(nnodes=2, rdzv_port=_port(cluster), max_restarts=1, timeout_s=300),
        "standin:killagent-node=1",
        instance,
    )
    assert not launched.success
    assert "exit code 137" in launched.logs and "node 1" in launched.logs
    assert launched.seconds < 60
    assert cluster.leftovers(launched.job_name) == {}


def test_secret_values_never_reach_the_dagster_logs(
    cluster: Cluster, instance, monkeypatch
) -> None:
    """Credentials go Secret -> envFrom -> pod; never through the manifest or the Dagster event
    log.
    """
    value = f"pw-{uuid.uuid4().hex}"
    secret = f"ft-test-creds-{uuid.uuid4().hex[:6]}"
    # also in the launching process: must not leak
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", value)
    cluster.create_secret(
        secret, {"MLFLOW_TRACKING_PASSWORD": value, "AWS_SECRET_ACCESS_KEY": value}
    )
    try:
        launched = launch_in_dagster(
            cluster.launcher(nnodes=1, env_secret_names=[secret]),
            "standin:env=MLFLOW_TRACKING_PASSWORD",
            instance,
            env={"MLFLOW_TRACKING_URI": "http://mlflow:5000"},
        )
    finally:
        cluster.delete_secret(secret)
    assert launched.success, launched.logs
    # delivered
    assert f"sha256={hashlib.sha256(value.encode()).hexdigest()[:12]} set=True" in launched.logs
    # referenced by name
    assert "Rendered manifests" in launched.logs and f"name: {secret}" in launched.logs
    assert value not in launched.logs


def test_a_missing_secret_fails_clearly(cluster: Cluster, instance) -> None:
    launched = launch_in_dagster(
        cluster.launcher(nnodes=1, env_secret_names=["does-not-exist"], timeout_s=120),
        "standin:ok",
        instance,
    )
    assert not launched.success
    assert "CreateContainerConfigError" in launched.logs and "does-not-exist" in launched.logs
    assert cluster.leftovers(launched.job_name) == {}


def launcher_requests(cluster: Cluster, since: str = "") -> list[dict]:
    """The launcher's requests (its ServiceAccount's) from the API server's audit log, received at
    or after ``since`` (an RFC 3339 time in UTC, as the audit log writes them; empty: all).
    """
    user = f"system:serviceaccount:{cluster.namespace}:finetune-launcher"
    return [
        e
        for e in audit_events(cluster.plane, user)
        if "objectRef" in e and e["requestReceivedTimestamp"] >= since
    ]


def verbs(events: list[dict]) -> set[tuple[str, str]]:
    """``(verb, resource)`` as RBAC names them (``pods/log``) of audit events."""
    out = set()
    for e in events:
        ref = e["objectRef"]
        sub = ref.get("subresource")
        out.add((e["verb"], f"{ref['resource']}/{sub}" if sub else ref["resource"]))
    return out


def test_rbac_grants_exactly_what_the_launcher_called(cluster: Cluster, instance) -> None:
    """The calls the launcher made in this session, as the real API server's audit log records
    them for its ServiceAccount, are exactly LAUNCHER_VERBS (which test_manifests compares with
    deploy/rbac.yaml's Role), and RBAC refused none of them; the JobSet backend's calls are
    test_jobset_plane.py's (they may or may not be in this session's log).
    """
    if cluster.plane is None:
        pytest.skip("reads the local plane's audit log")
    usual = LAUNCHER_VERBS - FALLBACK_VERBS - JOBSET_VERBS
    # run alone: one failing multi-node launch from an owning pod
    if verbs(launcher_requests(cluster)) - FALLBACK_VERBS - JOBSET_VERBS != usual:
        owner = cluster.create_pod(f"run-pod-{uuid.uuid4().hex[:6]}")
        launched = launch_in_dagster(
            cluster.launcher(nnodes=2, rdzv_port=free_port(), owner_pod=owner),
            "standin:fail-node=1",
            instance,
        )
        assert not launched.success
        with contextlib.suppress(Exception):
            cluster.delete_pod(owner)
    # the log backend writes each event as its request completes; a bound on reading it back
    wait_until(
        lambda: usual <= verbs(launcher_requests(cluster)), 30, "the launcher's audit events"
    )
    events = launcher_requests(cluster)
    called = verbs(events)
    assert called - FALLBACK_VERBS - JOBSET_VERBS == usual, sorted(called)
    assert called <= LAUNCHER_VERBS, sorted(called)
    forbidden = [e["requestURI"] for e in events if e["responseStatus"].get("code") == 403]
    assert forbidden == []


def test_node_loss_kills_the_whole_pod(cluster: Cluster, instance) -> None:
    """SIGKILL a whole pod's processes (a node lost with them) mid-run: on the plane through the
    node agent's pid files, the pod ends Failed 137 as the kernel's kill makes it.
    """
    import threading

    core, _ = cluster._apis()  # noqa: SLF001 - the harness' clients

    def kill_node_1() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pods = [
                p.metadata.name
                for p in core.list_namespaced_pod(
                    cluster.namespace, label_selector="batch.kubernetes.io/job-completion-index=1"
                ).items
                if p.status.phase == "Running"
            ]
            if pods:
                time.sleep(3)
                cluster.kill_pod(pods[0])
                return
            time.sleep(0.2)

    threading.Thread(target=kill_node_1, daemon=True).start()
    launched = launch_in_dagster(
        cluster.launcher(nnodes=2, rdzv_port=free_port(), timeout_s=300),
        "standin:sleep=600",
        instance,
    )
    assert not launched.success
    assert "exit code 137" in launched.logs
    assert launched.seconds < 60
    assert cluster.leftovers(launched.job_name) == {}
