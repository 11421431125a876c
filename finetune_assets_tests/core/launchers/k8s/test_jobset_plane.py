"""The JobSet backend on the local plane, with the real JobSet controller (sigs.k8s.io/jobset,
its CRD schema and webhooks) beside the real Job controller.

A 2-pod gang trains end to end through the JobSet's own headless Service, placed exclusively on
one node; and a SIGKILLed pod (a node lost with its processes) makes the JobSet controller
recreate the whole gang server-side (``status.restarts`` 1), which resumes from the checkpoint
under a newer fencing generation, while the launcher only watches.
"""

from __future__ import annotations

import re
import threading
import time

import kubernetes
import pytest

from finetune_assets.core.launchers.k8s.constants import JOB_LABEL
from finetune_assets.core.launchers.k8s.jobset import (
    GROUP,
    PLURAL,
    RESTART_LABEL,
    VERSION,
    child_job,
)
from finetune_assets_tests.core.launchers.k8s.conftest import Cluster, free_port
from finetune_assets_tests.core.launchers.k8s.helpers import launch_in_dagster

pytestmark = [pytest.mark.control_plane, pytest.mark.k8s]

GANG_STANDIN = "finetune_assets_tests.core.launchers.k8s.gang_standin"


@pytest.fixture
def plane_cluster(cluster: Cluster) -> Cluster:
    if cluster.plane is None:
        pytest.skip("needs the local plane's JobSet controller (the double has none)")
    return cluster


def custom(cluster: Cluster):
    return kubernetes.client.CustomObjectsApi(cluster.plane.api_client())


def jobset_left(cluster: Cluster, name: str) -> dict[str, list[str]]:
    """The JobSet, its child Job and its Service, where still there (beside ``leftovers``)."""
    core, batch = cluster._apis()  # noqa: SLF001 - the harness' clients
    left: dict[str, list[str]] = {}
    for kind, read in (
        (
            "jobset",
            lambda: custom(cluster).get_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, name
            ),
        ),
        ("job", lambda: batch.read_namespaced_job(child_job(name), cluster.namespace)),
    ):
        try:
            read()
            left[kind] = [name]
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise
    return left


def gone(cluster: Cluster, name: str) -> dict[str, list[str]]:
    deadline = time.monotonic() + 60
    while True:
        left = {**jobset_left(cluster, name), **cluster.leftovers(name, wait_s=0)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_a_jobset_gang_trains_end_to_end_on_one_exclusive_node(
    plane_cluster: Cluster, instance, tmp_path
) -> None:
    cluster = plane_cluster
    core, _ = cluster._apis()  # noqa: SLF001
    nodes: dict[str, str] = {}

    def watch_nodes() -> None:  # where the pods ran (they are gone once the launch returns)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(nodes) < 2:
            for p in core.list_namespaced_pod(
                cluster.namespace, label_selector=RESTART_LABEL
            ).items:
                if p.spec.node_name and p.metadata.labels.get(JOB_LABEL):
                    nodes[p.metadata.name] = p.spec.node_name
            time.sleep(0.3)

    threading.Thread(target=watch_nodes, daemon=True).start()
    launched = launch_in_dagster(
        cluster.launcher(
            backend="jobset",
            nnodes=2,
            rdzv_port=free_port(),
            trainer_module=GANG_STANDIN,
            exclusive_topology="kubernetes.io/hostname",
            timeout_s=300,
        ),
        f"standin:train=5,step_s=0.1,dir={tmp_path}",
        instance,
    )
    assert launched.success, launched.logs[-6000:]
    name = re.search(r"Launching training JobSet [^/]+/(\S+):", launched.logs).group(1)
    # rendezvous on pod 0 through the JobSet's Service, rank 0's log streamed
    assert f"{name}-node-0-0.{name}.{cluster.namespace}.svc" in launched.logs
    assert re.search(rf"\[{name}-node-0-0-\w+\] standin: node=0 rank=0", launched.logs)
    assert "trained global_step=5 resumed_at=0" in launched.logs
    assert "restarted the gang" not in launched.logs
    # exclusive placement: the follower went to the leader's node
    assert len(nodes) == 2 and len(set(nodes.values())) == 1, nodes
    assert f"Deleted JobSet {cluster.namespace}/{name}" in launched.logs
    assert gone(cluster, name) == {}


def test_a_killed_pod_restarts_the_gang_server_side_and_the_run_resumes(
    plane_cluster: Cluster, instance, tmp_path
) -> None:
    cluster = plane_cluster
    core, _ = cluster._apis()  # noqa: SLF001
    journal = tmp_path / "journal"
    seen: dict[str, int] = {}

    def kill_node_1_then_watch() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if journal.exists() and "step=3" in journal.read_text():
                break
            time.sleep(0.2)
        (pod,) = [
            p
            for p in core.list_namespaced_pod(
                cluster.namespace,
                label_selector=f"batch.kubernetes.io/job-completion-index=1,{RESTART_LABEL}=0",
            ).items
            if p.status.phase == "Running"
        ]
        name = pod.metadata.labels[JOB_LABEL]
        cluster.kill_pod(pod.metadata.name)
        seen["killed"] = 1
        while time.monotonic() < deadline:  # the JobSet's own count, before the launcher deletes it
            try:
                obj = custom(cluster).get_namespaced_custom_object(
                    GROUP, VERSION, cluster.namespace, PLURAL, name
                )
            except kubernetes.client.ApiException:
                return
            seen["restarts"] = (obj.get("status") or {}).get("restarts") or 0
            if seen["restarts"] >= 1:
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_node_1_then_watch, daemon=True)
    killer.start()
    launched = launch_in_dagster(
        cluster.launcher(
            backend="jobset",
            nnodes=2,
            rdzv_port=free_port(),
            trainer_module=GANG_STANDIN,
            jobset_max_restarts=1,
            max_resubmissions=0,  # nothing client-side: the restart is the JobSet controller's
            timeout_s=600,
        ),
        f"standin:train=40,step_s=0.2,hold_at=3,dir={tmp_path}",
        instance,
    )
    killer.join(30)
    assert launched.success, launched.logs[-6000:]
    assert seen == {"killed": 1, "restarts": 1}, seen
    assert "the JobSet controller restarted the gang (restart 1 of at most 1)" in launched.logs
    assert launched.logs.count("Launching training JobSet") == 1 and "resubmitting" not in (
        launched.logs
    )
    # the new gang resumed from the old gang's last accepted step, under a newer generation
    lines = journal.read_text().splitlines()
    gens = sorted({int(g) for g in re.findall(r"generation=(\d+)", "\n".join(lines))})
    assert len(gens) == 2 and gens[1] == gens[0] + 1, gens  # <launch><restart>: 0, then 1
    resumed = int(re.findall(r"generation=\d+ resumes at step (\d+)", launched.logs)[-1])
    last_old = max(
        int(s) for s in re.findall(rf"accepted generation={gens[0]} step=(\d+)", "\n".join(lines))
    )
    assert 3 <= resumed == last_old
    assert "trained global_step=40" in launched.logs
    name = re.search(r"Launching training JobSet [^/]+/(\S+):", launched.logs).group(1)
    assert gone(cluster, name) == {}


def test_a_configuration_error_is_never_restarted(plane_cluster: Cluster, instance) -> None:
    """A pod given GPUs that sees no CUDA exits 78 (EX_CONFIG) before torchrun starts; with
    restarts left, the JobSet's ``FailJobSet`` rule matches the real Job controller's failure
    message, so the JobSet fails at once and the run with it.
    """
    cluster = plane_cluster
    launched = launch_in_dagster(
        cluster.launcher(
            backend="jobset",
            nnodes=2,
            rdzv_port=free_port(),
            gpus_per_node=1,  # the plane counts GPUs; CUDA sees none: the preflight exits 78
            shm_size="256Mi",
            jobset_max_restarts=2,
            timeout_s=300,
        ),
        "standin:ok",
        instance,
    )
    assert not launched.success
    assert "CUDA preflight failed" in launched.logs and "not retried" in launched.logs
    assert "restarted the gang" not in launched.logs
    assert "FailJobSetFailurePolicyAction" in launched.logs, launched.logs[-4000:]
    name = re.search(r"Launching training JobSet [^/]+/(\S+):", launched.logs).group(1)
    assert gone(cluster, name) == {}


def test_kueue_admits_the_jobset_whole(plane_cluster: Cluster, instance) -> None:
    """``queue_name`` with backend jobset: the real Kueue's JobSet integration makes one Workload
    for the JobSet (the child Job carries no queue label, so none of its own), admits it, and
    the gang runs.
    """
    from finetune_assets_tests.core.launchers.k8s.plane_objects import KUEUE, kueue_queues, tag

    cluster = plane_cluster
    queues = kueue_queues(cluster.plane, cluster.namespace, tag())
    owners: set[str] = set()
    done = threading.Event()

    def watch_workloads() -> None:
        while not done.is_set():
            for w in custom(cluster).list_namespaced_custom_object(
                *KUEUE, cluster.namespace, "workloads"
            )["items"]:
                for ref in w["metadata"].get("ownerReferences") or []:
                    owners.add(f"{ref['kind']}/{ref['name']}")
            time.sleep(0.3)

    watcher = threading.Thread(target=watch_workloads, daemon=True)
    watcher.start()
    try:
        launched = launch_in_dagster(
            cluster.launcher(
                backend="jobset", nnodes=2, rdzv_port=free_port(), queue_name=queues["research"]
            ),
            "standin:ok",
            instance,
        )
    finally:
        done.set()
        watcher.join(10)
    assert launched.success, launched.logs[-6000:]
    name = re.search(r"Launching training JobSet [^/]+/(\S+):", launched.logs).group(1)
    mine = {o for o in owners if name in o}
    assert mine == {f"JobSet/{name}"}, owners
    assert gone(cluster, name) == {}
