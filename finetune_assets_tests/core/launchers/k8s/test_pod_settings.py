"""Pods that fit real clusters: the passthrough, separate worker pools, the named container, Kueue,
and gang keys scoped to a deployment.
"""

from __future__ import annotations

import logging
import threading
import time

import kubernetes
import pytest

from finetune_assets.core.launchers.fanout import FanOut
from finetune_assets.core.launchers.k8s import gang_key
from finetune_assets.core.launchers.k8s.fanout import K8sFanOutRunner
from finetune_assets.defs.resources.k8s_launcher import K8sTorchrunLauncher
from finetune_assets_tests.core.launchers.k8s.conftest import RESTRICTED_CONTAINER, Cluster
from finetune_assets_tests.core.launchers.k8s.helpers import launch_in_dagster
from finetune_assets_tests.core.launchers.k8s.test_manifests import CONFIGS, render

LABELS = {
    "dagster/run-id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
    "dagster/asset": "trained",
    "dagster/partition": "v1",
}


def test_the_passthrough_and_the_kueue_queue_reach_job_and_pods() -> None:
    _, (_, job) = render("ft-abc123", **CONFIGS["2-nodes-passthrough-kueue"])
    template, spec = job["spec"]["template"], job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert template["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert spec["priorityClassName"] == "training-high" and spec["schedulerName"] == "volcano"
    assert spec["runtimeClassName"] == "nvidia" and spec["affinity"]["nodeAffinity"]
    # deep-merged: the launcher's own resources and security stay, the extra device is added
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert job["metadata"]["annotations"]["team.example.com/owner"] == "ml"
    # Kueue: created suspended, with the queue label; Kueue admits the whole Job at once
    assert (
        job["spec"]["suspend"] is True
        and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    )
    assert job["metadata"]["labels"]["finetune-assets/deployment"] == "prod"


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"pod_spec": {}}, "unknown key"),
        ({"job_spec_config": {"parallelism": 3}}, "set by the launcher"),
        ({"container_config": {"command": ["sh"]}}, "set by the launcher"),
        (
            {"container_config": {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]}},
            "looks like a credential",
        ),
        ({"container_config": {"securityContext": {"privileged": True}}}, "privileged"),
        ({"pod_spec_config": ["not", "a", "mapping"]}, "must be a mapping"),
    ],
)
def test_the_passthrough_refuses_what_would_break_the_gang_or_leak(config, says) -> None:
    with pytest.raises(ValueError, match=says):
        K8sTorchrunLauncher(image="x", k8s_config=config)


def test_fanout_workers_get_their_own_pool_and_passthrough() -> None:
    launcher = K8sTorchrunLauncher(
        image="x",
        namespace="ml",
        gpus_per_node=8,
        node_selector={"pool": "gpu"},
        worker_node_selector={"pool": "cpu"},
        worker_cpu_request="2",
        worker_memory_request="3Gi",
        worker_k8s_config={"pod_spec_config": {"priorityClassName": "batch-low"}},
    )
    job = K8sFanOutRunner(launcher, labels=LABELS).render(
        FanOut("tok", ["python", "-c", "0"], 4, {}), "tok-abc"
    )
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert spec["nodeSelector"] == {"pool": "cpu"} and spec["priorityClassName"] == "batch-low"
    assert container["resources"]["requests"] == {"cpu": "2", "memory": "3Gi"}  # no GPU
    assert "tolerations" not in spec


def test_the_gang_key_includes_the_deployment() -> None:
    blue, green = (
        K8sTorchrunLauncher(image="x", namespace="ml", deployment=d) for d in ("blue", "green")
    )
    assert gang_key(LABELS, blue.gang_scope) != gang_key(LABELS, green.gang_scope)
    other_ns = K8sTorchrunLauncher(image="x", namespace="ml2", deployment="blue")
    assert gang_key(LABELS, blue.gang_scope) != gang_key(LABELS, other_ns.gang_scope)


@pytest.mark.k8s
def test_a_sidecar_first_run_pod_gives_the_dagster_containers_image(cluster: Cluster) -> None:
    core, _ = cluster._apis()
    core.create_namespaced_pod(
        cluster.namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "run-pod-mesh"},
            "spec": {
                "containers": [
                    {
                        "name": "istio-proxy",
                        "image": "docker.io/istio/proxyv2:1.24",
                        **RESTRICTED_CONTAINER,
                    },
                    {
                        "name": "dagster",
                        "image": "registry.example.com/finetune-assets:7",
                        **RESTRICTED_CONTAINER,
                    },
                ]
            },
        },
    )
    launcher = cluster.launcher(image=None, owner_pod="run-pod-mesh")
    owner, image = launcher._owner_reference(logging.getLogger("test"), launcher.api())
    assert image == "registry.example.com/finetune-assets:7" and owner["name"] == "run-pod-mesh"
    cluster.delete_pod("run-pod-mesh")


@pytest.mark.k8s
def test_two_deployments_with_the_same_partition_leave_each_other_alone(cluster: Cluster) -> None:
    """Blue's left-over Job (its run is over) of partition "twins": green's de-duplication does not
    see it; blue's own next launch removes it. (Created suspended: no pod needs to run.)
    """
    from finetune_assets.core.launchers import TrainingSpec

    labels = {**LABELS, "dagster/run-id": "gone-run", "dagster/partition": "twins"}
    blue, green = (cluster.launcher(nnodes=1, deployment=d) for d in ("blue", "green"))
    _, job = blue.render(
        TrainingSpec(name="blue-gang", config_url="standin:sleep=600", labels=labels), "blue-gang"
    )
    job["spec"]["suspend"] = True
    cluster.create_job(job)
    log = logging.getLogger("test")
    green._remove_live_gangs(
        log, green.api(), gang_key(labels, green.gang_scope), run_state=lambda r: None
    )
    assert "job" in cluster.leftovers("blue-gang", wait_s=0)  # untouched
    blue._remove_live_gangs(
        log, blue.api(), gang_key(labels, blue.gang_scope), run_state=lambda r: None
    )
    assert cluster.leftovers("blue-gang") == {}  # its own deployment's retry removes it


KUEUE = ("kueue.x-k8s.io", "v1beta2")


@pytest.mark.k8s
def test_a_kueue_suspended_gang_is_waited_on_and_trains_once_admitted(
    cluster: Cluster, instance
) -> None:
    """The real Kueue (on the local plane) holds the Job: its ClusterQueue starts on
    ``stopPolicy: Hold`` (a busy cluster's queue: 20 minutes there), so the Job stays suspended,
    with a queued Workload and no pod; the launcher waits (its start timeout counts from
    admission). The queue is released: Kueue admits the Workload, unsuspends the Job, the gang
    trains.
    """
    if cluster.plane is None:
        pytest.skip("needs the local plane's Kueue (or a cluster with Kueue: set up the queues)")
    client = cluster.plane.api_client()
    custom = kubernetes.client.CustomObjectsApi(client)
    core = kubernetes.client.CoreV1Api(client)
    group, version = KUEUE
    cq = f"cq-{cluster.namespace}"
    if not _exists(
        lambda: custom.get_cluster_custom_object(
            group, version, "resourceflavors", "default-flavor"
        )
    ):
        custom.create_cluster_custom_object(
            group,
            version,
            "resourceflavors",
            {
                "apiVersion": f"{group}/{version}",
                "kind": "ResourceFlavor",
                "metadata": {"name": "default-flavor"},
            },
        )
    custom.create_cluster_custom_object(
        group,
        version,
        "clusterqueues",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "stopPolicy": "Hold",
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "default-flavor",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "64"},
                                    {"name": "memory", "nominalQuota": "512Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "16"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    custom.create_namespaced_custom_object(
        group,
        version,
        cluster.namespace,
        "localqueues",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "LocalQueue",
            "metadata": {"name": "gpu-queue"},
            "spec": {"clusterQueue": cq},
        },
    )
    seen: dict = {}

    def release() -> None:
        """Once Kueue queued the launcher's Job (its Workload exists), note its pods, release."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "released" not in seen:
            workloads = custom.list_namespaced_custom_object(
                group, version, cluster.namespace, "workloads"
            )["items"]
            queued = [w for w in workloads if w["spec"].get("queueName") == "gpu-queue"]
            if queued:
                job = queued[0]["metadata"]["ownerReferences"][0]["name"]
                seen["pods_before"] = [
                    p.metadata.name
                    for p in core.list_namespaced_pod(
                        cluster.namespace, label_selector=f"job-name={job}"
                    ).items
                ]
                seen["workload"] = queued[0]["metadata"]["name"]
                custom.patch_cluster_custom_object(
                    group, version, "clusterqueues", cq, {"spec": {"stopPolicy": "None"}}
                )
                seen["released"] = True
                return
            time.sleep(0.2)

    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    try:
        launched = launch_in_dagster(
            cluster.launcher(nnodes=1, queue_name="gpu-queue", start_timeout_s=2),
            "standin:ok",
            instance,
        )
        releaser.join(30)
        assert launched.success, launched.logs[-3000:]
        assert seen.get("released") and seen["pods_before"] == [], seen
        assert "waiting for admission" in launched.logs and "JobSuspended" in launched.logs
        assert cluster.leftovers(launched.job_name) == {}
    finally:
        custom.delete_namespaced_custom_object(
            group, version, cluster.namespace, "localqueues", "gpu-queue"
        )
        custom.delete_cluster_custom_object(group, version, "clusterqueues", cq)


def _exists(read) -> bool:
    try:
        read()
        return True
    except kubernetes.client.ApiException as e:
        if e.status == 404:
            return False
        raise
