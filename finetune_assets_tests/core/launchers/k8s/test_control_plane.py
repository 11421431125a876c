"""The local control plane is the real thing: upstream API server, controllers, scheduler, Kueue.

What ``.ci/k8s/control-plane start`` must give the Kubernetes tests (issue 34's first "done means"
line): a real version, real validation, Kueue's API, two Ready nodes with GPUs, and an Indexed Job
run by the real Job controller as local processes whose logs come back through ``pods/log``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import kubernetes
import pytest

from finetune_assets_tests.core.launchers.k8s.conftest import CONTROL_PLANE, REPO, ControlPlane

pytestmark = pytest.mark.control_plane

NS = "cp-smoke"


def pinned_kubernetes_version() -> str:
    text = (REPO / ".ci" / "k8s" / "plane" / "go.mod").read_text()
    m = re.search(r"k8s\.io/kubernetes (v\S+)", text)
    assert m
    return m[1]


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane):
    client = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    try:
        core.create_namespace({"metadata": {"name": NS}})
    except kubernetes.client.ApiException as e:
        if e.status != 409:
            raise
    deadline = time.monotonic() + 60  # the real ServiceAccount controller makes "default"
    while True:
        try:
            core.read_namespaced_service_account("default", NS)
            break
        except kubernetes.client.ApiException:
            assert time.monotonic() < deadline, "no default ServiceAccount in the namespace"
            time.sleep(0.5)
    return client


def wait(what: str, check, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def pod_log(core, name: str, follow: bool = False) -> str:
    """The body as sent (the client's preloaded ``str`` is the repr of the bytes)."""
    resp = core.read_namespaced_pod_log(
        name, NS, container="worker", follow=follow, _preload_content=False
    )
    return resp.data.decode()


def test_the_api_server_is_the_pinned_upstream_build(api) -> None:
    info = kubernetes.client.VersionApi(api).get_code()
    assert info.git_version == pinned_kubernetes_version()
    assert info.git_tree_state == "clean"


def test_strict_field_validation_refuses_an_unknown_field(api) -> None:
    core = kubernetes.client.CoreV1Api(api)
    body = {"metadata": {"name": "strict"}, "data": {"a": "b"}, "dataa": {"typo": "x"}}
    with pytest.raises(kubernetes.client.ApiException) as e:
        core.create_namespaced_config_map(NS, body, field_validation="Strict")
    assert e.value.status == 400
    message = json.loads(e.value.body)["message"]
    assert 'strict decoding error: unknown field "dataa"' in message


def test_backoff_limit_per_index_on_a_non_indexed_job_is_refused(api) -> None:
    batch = kubernetes.client.BatchV1Api(api)
    job = {
        "metadata": {"name": "not-indexed"},
        "spec": {
            "completionMode": "NonIndexed",
            "backoffLimitPerIndex": 1,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "x", "command": ["true"]}],
                }
            },
        },
    }
    with pytest.raises(kubernetes.client.ApiException) as e:
        batch.create_namespaced_job(NS, job)
    assert e.value.status == 422
    assert "backoffLimitPerIndex" in e.value.body


def test_kueue_serves_its_api_and_its_webhooks_answer(api) -> None:
    groups = {g.name for g in kubernetes.client.ApisApi(api).get_api_versions().groups}
    assert "kueue.x-k8s.io" in groups
    custom = kubernetes.client.CustomObjectsApi(api)
    # a ClusterQueue passes Kueue's mutating and validating webhooks (failurePolicy: Fail)
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    created = custom.create_cluster_custom_object(
        "kueue.x-k8s.io",
        "v1beta2",
        "clusterqueues",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {"namespaceSelector": {}},
        },
    )
    assert created["metadata"]["name"] == name
    # the mutating webhook defaulted what the CRD's schema has no default for
    assert "queueingStrategy" in created["spec"]
    custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", name)


def test_two_ready_nodes_advertise_gpus(api) -> None:
    nodes = kubernetes.client.CoreV1Api(api).list_node().items
    ready = [
        n
        for n in nodes
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    ]
    assert len(ready) >= 2
    assert all(n.status.allocatable.get("nvidia.com/gpu") == "8" for n in ready)


def test_an_indexed_job_runs_as_processes_and_its_pods_go_with_it(api) -> None:
    core, batch = kubernetes.client.CoreV1Api(api), kubernetes.client.BatchV1Api(api)
    name = f"indexed-{uuid.uuid4().hex[:6]}"
    batch.create_namespaced_job(
        NS,
        {
            "metadata": {"name": name},
            "spec": {
                "completionMode": "Indexed",
                "completions": 2,
                "parallelism": 2,
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "worker",
                                "image": "finetune-assets:test",
                                "command": ["sh", "-c"],
                                "args": [
                                    'echo "start $JOB_COMPLETION_INDEX pid $$$$"; sleep 2; '
                                    'echo "done $JOB_COMPLETION_INDEX on $(hostname)"'
                                ],
                                "resources": {
                                    "requests": {"cpu": "100m", "nvidia.com/gpu": 1},
                                    "limits": {"nvidia.com/gpu": 1},
                                },
                            }
                        ],
                    }
                },
            },
        },
    )
    selector = f"job-name={name}"
    running = wait(
        "a running pod",
        lambda: [
            p
            for p in core.list_namespaced_pod(NS, label_selector=selector).items
            if p.status.phase == "Running"
        ],
    )
    # follow the log of a running pod to its end, as the launcher follows rank 0
    followed = pod_log(core, running[0].metadata.name, follow=True)
    assert "done" in followed

    def complete():
        job = batch.read_namespaced_job(name, NS)
        conds = {c.type: c.status for c in job.status.conditions or []}
        assert conds.get("Failed") != "True", job.status
        return conds.get("Complete") == "True" and job

    job = wait("the Job to complete", complete)
    assert job.status.succeeded == 2 and job.status.completed_indexes == "0,1"
    pods = core.list_namespaced_pod(NS, label_selector=selector).items
    assert sorted(
        p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods
    ) == ["0", "1"]
    assert {p.spec.node_name for p in pods} <= {"fa-node-1", "fa-node-2"}
    logs = {}
    for p in pods:
        index = p.metadata.annotations["batch.kubernetes.io/job-completion-index"]
        logs[index] = pod_log(core, p.metadata.name)
        # the real process ran: its own pid, the index the real Job controller gave it
        assert re.search(rf"^start {index} pid \d+$", logs[index], re.M), logs[index]
        assert f"done {index} on {name}-{index}" in logs[index]
    batch.delete_namespaced_job(name, NS, propagation_policy="Background")
    wait(
        "the garbage collector to remove the pods",
        lambda: not core.list_namespaced_pod(NS, label_selector=selector).items,
    )


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    """A second plane of its own, with a pod running: ``stop`` ends all of it."""
    d = tmp_path / "plane"
    subprocess.run(
        [sys.executable, str(CONTROL_PLANE), "start", str(d)],
        check=True,
        timeout=1800,
        capture_output=True,
    )
    plane = ControlPlane(dir=d, kubeconfig=str(d / "kubeconfig"))
    try:
        core = kubernetes.client.CoreV1Api(plane.api_client())
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": "sleeper"},
                "spec": {"containers": [{"name": "c", "image": "x", "command": ["sleep", "3600"]}]},
            },
        )
        wait("the pod's process", lambda: any(k.startswith("pod-") for k in plane.pids()))
        pids = plane.pids()
        assert {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kueue",
            "node-1",
            "node-2",
        } <= set(pids)
    finally:
        plane.stop()
    alive = [name for name, pid in pids.items() if _alive(pid)]
    assert not alive, f"still running after stop: {alive}"
    assert not list((d / "addresses").glob("*")), "pod addresses left on lo"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
