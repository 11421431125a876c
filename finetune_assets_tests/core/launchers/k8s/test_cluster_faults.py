"""What a real cluster does to a gang that the kind path never shows, on the local plane: from the
real components (the Eviction API, the scheduler, ResourceQuota admission, the garbage collector);
from the kubelet's part, which the node agents play as the v1.36 kubelet reports it (a late start,
DNS lagging behind a pod, an admission error, an eviction under node pressure, an image the
registry lacks: ``node_faults``); and a log stream reset mid-response by a thin proxy in front of
the API server (``api_proxy``), the one fault no real part makes on purpose. The kubelet-fault
tests skip on a real cluster (its kubelets are out of reach).

Delays are scaled down from minutes to seconds; each test names the defect it would have caught.
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from finetune_assets_tests.core.launchers.k8s.api_proxy import CuttingProxy
from finetune_assets_tests.core.launchers.k8s.conftest import Cluster, free_port
from finetune_assets_tests.core.launchers.k8s.helpers import launch_in_dagster

pytestmark = pytest.mark.k8s


INDEX = "batch.kubernetes.io/job-completion-index"


def test_pod0_starting_last_with_lagging_dns_still_trains_with_rank0_on_pod0(
    cluster: Cluster, node_faults, instance
) -> None:
    """Pod 0 waits for its GPU node / image while pod 1 runs, and pod DNS names resolve only 10 s
    after a pod runs: pod 1 waits in the rendezvous, pod 0 hosts the store without resolving itself.
    (Before the fix: nobody hosted the store, every pod failed after torchrun's 60 s read timeout.)
    """
    node_faults.set(dns_lag_s=10.0)
    node_faults.add("start_delay", namespace=cluster.namespace, labels={INDEX: "0"}, seconds=3.0)
    launched = launch_in_dagster(
        cluster.launcher(nnodes=2, rdzv_port=free_port()), "standin:allreduce", instance
    )
    assert launched.success, launched.logs
    assert node_faults.left("start_delay") == [0]  # pod 0 did start late
    assert "standin: allreduce=3 world=2" in launched.logs
    assert re.search(r"standin: node=0 rank=0 world=2 attempt=0 host=\S+-0\b", launched.logs), (
        launched.logs
    )


def test_a_rendezvous_timeout_shorter_than_the_start_timeout_is_refused(cluster: Cluster) -> None:
    """Early pods would leave the rendezvous (holding GPUs) while the launcher still waits for
    the last.
    """
    with pytest.raises(ValueError, match="rdzv_timeout_s=2 is shorter than start_timeout_s=1800"):
        cluster.launcher(nnodes=2, rdzv_timeout_s=2)
    assert cluster.launcher(nnodes=2, rdzv_timeout_s=2, start_timeout_s=2).rdzv_timeout_s == 2


# -- disruption: eviction and node loss resubmit the gang, which resumes ---------------------------


def _evict_index(cluster: Cluster, index: int) -> None:
    """The Eviction API (a drain, a spot reclaim) on the running pod of ``index``: the real API
    server marks it ``DisruptionTarget`` (EvictionByEvictionAPI) and deletes it gracefully.
    """
    core, _ = cluster._apis()  # noqa: SLF001 - the harness' clients
    pods = [
        p
        for p in core.list_namespaced_pod(
            cluster.namespace, label_selector=f"batch.kubernetes.io/job-completion-index={index}"
        ).items
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]
    name = pods[0].metadata.name
    core.create_namespaced_pod_eviction(
        name, cluster.namespace, {"metadata": {"name": name, "namespace": cluster.namespace}}
    )


class _WhenStep(threading.Thread):
    """Runs ``then`` once the checkpoint reaches ``step`` (the standin holds there: ``hold_at``),
    retrying while it raises (the pod may not read Running yet); ``fired`` says it took effect.
    """

    def __init__(self, ckpt, step: int, then, timeout_s: float = 90.0) -> None:
        super().__init__(daemon=True)
        self.ckpt, self.step, self.then, self.timeout_s = ckpt, step, then, timeout_s
        self.fired, self.errors = False, []
        self.start()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline and not self.fired:
            text = self.ckpt.read_text().strip() if self.ckpt.exists() else ""
            if text.isdigit() and int(text) >= self.step:
                try:
                    self.then()
                    self.fired = True
                except Exception as exc:  # noqa: BLE001 - reported by the test's assertion
                    self.errors.append(repr(exc))
            time.sleep(0.1)


def test_an_evicted_pod_resubmits_the_gang_which_resumes(
    cluster: Cluster, instance, tmp_path
) -> None:
    """Spot reclaim / drain evicts the pod mid-run: a fresh gang resumes from the checkpoint and
    finishes with the global step of an uninterrupted run. One pod keeps it cheap; that the peers'
    failures after an eviction count as the disruption, and that a node going NotReady ends in the
    taint manager's eviction (the same ``DisruptionTarget`` path), is ``test_supervision.py`` on
    recorded objects.
    """
    ckpt = tmp_path / "step"
    evict = _WhenStep(ckpt, 2, lambda: _evict_index(cluster, 0))
    launched = launch_in_dagster(
        cluster.launcher(nnodes=1, max_resubmissions=1, timeout_s=120),
        f"standin:train=6,step_s=0.4,hold_at=2,ckpt={ckpt}",
        instance,
    )
    assert evict.fired, evict.errors[-3:]
    assert launched.success, launched.logs[-4000:]
    # The pod stops at SIGTERM within a second and the Job controller (podFailurePolicy Ignore)
    # drops it at once: the launcher reads the eviction from DisruptionTarget if a poll saw the
    # pod deleting, else from the pod's absence. Either way the gang is resubmitted, not left to
    # the Job controller's replacement pod (it would not rejoin a multi-node gang).
    assert re.search(
        r"EvictionByEvictionAPI|\(index 0\) was deleted while it ran", launched.logs
    ), launched.logs[-4000:]
    assert "resubmitting the gang (1/1)" in launched.logs, launched.logs[-4000:]
    finished = re.findall(r"standin: trained global_step=(\d+) resumed_at=(\d+)", launched.logs)
    assert len(finished) == 1, launched.logs[-3000:]  # only the resubmitted gang finished
    # same global step as uninterrupted, resumed where the evicted gang held
    assert finished[0] == ("6", "2"), finished
    assert cluster.leftovers(launched.job_name) == {}


def test_kubelet_admission_errors_and_evictions_resubmit(
    cluster: Cluster, node_faults, instance, tmp_path
) -> None:
    """The first pod fails kubelet admission (Failed / UnexpectedAdmissionError, no
    DisruptionTarget: a device plugin restarted); the next is evicted by the kubelet for node
    memory pressure (Failed / Evicted with DisruptionTarget TerminationByKubelet, as kubelets
    write it since v1.26). Both are the cluster's doing (failures.py, verdict.py): resubmitted, and
    the gang resumes from the checkpoint. (An eviction for the pod's own emptyDir limit is not:
    test_failure_table.)
    """
    node_faults.add("admission_error", namespace=cluster.namespace)
    ckpt = tmp_path / "step"
    pressure = _WhenStep(
        ckpt, 2, lambda: node_faults.add("evict", namespace=cluster.namespace, resource="memory")
    )
    launched = launch_in_dagster(
        cluster.launcher(nnodes=1, max_resubmissions=2, timeout_s=120),
        f"standin:train=4,step_s=0.4,hold_at=2,ckpt={ckpt}",
        instance,
    )
    assert pressure.fired, pressure.errors[-3:]
    assert launched.success, launched.logs[-4000:]
    assert (
        "UnexpectedAdmissionError (kubelet admission failed (e.g. a device plugin restarted)): "
        "Pod was rejected: Allocate failed due to no healthy devices present" in launched.logs
    ), launched.logs[-4000:]
    assert (
        "TerminationByKubelet: The node was low on resource: memory." in launched.logs
        and "resubmitting the gang (2/2)" in launched.logs
    ), launched.logs[-4000:]
    assert node_faults.left("admission_error") == node_faults.left("evict") == [0]
    finished = re.findall(r"standin: trained global_step=(\d+) resumed_at=(\d+)", launched.logs)
    assert finished == [("4", "2")], launched.logs[-3000:]


# -- silent waits: the reason reaches the run within a bounded time --------------------------------


@pytest.mark.parametrize("fault", ["unschedulable", "refuse_pods"])
def test_pods_that_cannot_start_fail_with_the_reason(cluster: Cluster, instance, fault) -> None:
    """The real scheduler (9 GPUs per pod, nodes have 8) and ResourceQuota admission (8 GPUs in
    the namespace): the pods never start and the reason reaches the run.
    """
    core, _ = cluster._apis()  # noqa: SLF001 - the harness' clients
    quota = None
    if fault == "refuse_pods":
        quota = core.create_namespaced_resource_quota(
            cluster.namespace,
            {"metadata": {"name": "gpu-quota"}, "spec": {"hard": {"requests.nvidia.com/gpu": "8"}}},
        )
    expect = {
        "unschedulable": r"Unschedulable: 0/2 nodes are available: .*Insufficient nvidia\.com/gpu",
        "refuse_pods": r'FailedCreate: Error creating: pods "\S+" is forbidden: exceeded quota: '
        r"gpu-quota, requested: requests\.nvidia\.com/gpu=9",
    }[fault]
    try:
        launched = launch_in_dagster(
            cluster.launcher(
                nnodes=1,
                start_timeout_s=2,
                gpus_per_node=9,
                cpu_request="1",
                memory_request="1Gi",
                memory_limit="auto",
            ),
            "standin:ok",
            instance,
        )
    finally:
        if quota is not None:
            core.delete_namespaced_resource_quota("gpu-quota", cluster.namespace)
    assert not launched.success
    assert "did not all start within start_timeout_s=2" in launched.logs, launched.logs[-3000:]
    assert re.search(expect, launched.logs), launched.logs[-3000:]
    assert cluster.leftovers(launched.job_name) == {}


def test_an_image_pull_error_fails_at_once_with_the_kubelets_message(
    cluster: Cluster, node_faults, instance
) -> None:
    """A tag the registry does not have: the kubelet retries the pull for ever (back-off), but
    "not found" will not fix itself, so the run fails as soon as the pod says so, not at
    ``start_timeout_s`` or ``timeout_s``.
    """
    image = "registry.example.com/finetune-assets:no-such-tag"
    node_faults.set(missing_images=[image])
    launched = launch_in_dagster(
        cluster.launcher(nnodes=1, image=image, start_timeout_s=1800, timeout_s=600),
        "standin:ok",
        instance,
    )
    assert not launched.success
    assert (
        "ErrImagePull: rpc error: code = NotFound desc = failed to pull and unpack image "
        f'"{image}"' in launched.logs
    ), launched.logs[-3000:]
    # the kubelet's Event, in the failure message
    assert f'Failed to pull image "{image}"' in launched.logs, launched.logs[-3000:]
    assert "cannot start its pods" in launched.logs and "timed out" not in launched.logs
    assert cluster.leftovers(launched.job_name) == {}


# -- ownership: a dead launcher leaves no gang ---------------------------------------------------


def _launch_and_abandon(cluster: Cluster, owner: str | None, partition: str) -> str:
    """Start a gang from a separate process and SIGKILL that process once the trainer runs
    (OOMKilled run pod).
    """
    import json
    import signal
    import subprocess
    import sys

    # with an owner pod, no image: the launcher takes the launching pod's own image (one image
    # setting)
    fields = json.dumps(
        dict(
            image=None if owner else cluster.image,
            namespace=cluster.namespace,
            load_incluster_config=False,
            kubeconfig_file=cluster.kubeconfig,
            trainer_module="finetune_assets_tests.core.launchers.k8s.standin",
            nnodes=1,
            owner_pod=owner,
            poll_interval_s=0.5,
            memory_limit="2Gi",
            memory_request="256Mi",
            cpu_request="100m",
        )
    )
    code = f"""
import json, logging, sys, types
import dagster as dg
from finetune_assets.core.launchers import TrainingSpec
from finetune_assets.defs.resources.k8s_launcher import K8sTorchrunLauncher
class C:  # the parts of a Dagster context the launcher uses
    log, instance = logging.getLogger("launcher"), dg.DagsterInstance.ephemeral()
    run = types.SimpleNamespace(run_id="dead-run")
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
K8sTorchrunLauncher(**json.loads({fields!r})).launch(C(), TrainingSpec(
    name="abandoned",
    config_url="standin:sleep=600",
    labels={{
        "dagster/asset": "trained",
        "dagster/partition": {partition!r},
        "dagster/run-id": "dead-run",
    }},
))
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    name, seen = None, []
    for line in proc.stdout:
        seen.append(line)
        if m := re.search(r"Launching training Job [^/]+/(\S+):", line):
            name = m.group(1)
        if "standin: sleeping" in line:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert name is not None, "".join(seen[-30:])
    return name


def test_the_launching_pod_dying_garbage_collects_the_gang(cluster: Cluster, instance) -> None:
    owner = cluster.create_pod("run-pod-gc")
    name = _launch_and_abandon(cluster, owner, partition="gc")
    assert "job" in cluster.leftovers(name, wait_s=0)  # the launcher is dead; the gang lives on
    cluster.delete_pod(owner)  # the run pod goes (OOMKilled, evicted, node lost)
    assert cluster.leftovers(name) == {}  # owner references: Job -> pods, Job -> Service


def test_the_next_attempt_removes_a_live_gang_of_the_same_partition(
    cluster: Cluster, instance
) -> None:
    """A gang left running by a dead attempt (created here directly, as that attempt rendered
    it).
    """
    from finetune_assets.core.launchers import TrainingSpec

    name = "left-over-gang"
    _, job = cluster.launcher(nnodes=1).render(
        TrainingSpec(
            name=name,
            config_url="standin:sleep=600",
            labels={
                "dagster/asset": "trained",
                "dagster/partition": "dedup",
                "dagster/run-id": "dead-run",
            },
        ),
        name,
    )
    cluster.create_job(job)
    launched = launch_in_dagster(
        cluster.launcher(nnodes=1), "standin:ok", instance, partition="dedup"
    )
    assert launched.success, launched.logs[-3000:]
    assert (
        f"Deleting live training Job {cluster.namespace}/{name} of the same asset and partition "
        "(left by run dead-run, which is over)" in launched.logs
    )
    assert cluster.leftovers(name) == {}


# -- logs -----------------------------------------------------------------------------------------


def test_the_log_follower_resumes_after_the_stream_breaks(
    cluster: Cluster, instance, tmp_path
) -> None:
    """Every followed log stream of the launcher is reset half a second in (a thin proxy in front
    of the API server): the follower re-opens it and skips what it delivered.
    """
    if cluster.plane is None:
        pytest.skip("the resetting proxy stands in front of the local plane's API server")
    with CuttingProxy(cluster.plane, cut_follow_s=0.5) as proxy:
        kubeconfig = proxy.kubeconfig(cluster.launcher_kubeconfig, tmp_path / "kubeconfig")
        launched = launch_in_dagster(
            cluster.launcher(nnodes=1, kubeconfig_file=kubeconfig), "standin:lines=60", instance
        )
    assert launched.success, launched.logs[-3000:]
    assert proxy.cuts >= 2, "the streams were not reset"
    lines = re.findall(r"\] standin: line (\d+)$", launched.logs, flags=re.M)
    assert lines == [str(i) for i in range(60)]  # every line once, in order, despite the breaks


def test_a_live_gang_of_a_running_dagster_run_is_left_alone(cluster: Cluster, instance) -> None:
    """Dagster is asked first: the other run is STARTED, so its Job is not deleted and the launch
    fails naming it; once that run is gone from the instance, the next launch removes the orphan.
    """
    import dagster as dg

    from finetune_assets.core.launchers import TrainingSpec

    other = "5e1f0c2a-0000-4000-8000-00000000beef"
    instance.add_run(
        dg.DagsterRun(job_name="other_job", run_id=other, status=dg.DagsterRunStatus.STARTED)
    )
    name = "live-other-run"
    _, job = cluster.launcher(nnodes=1).render(
        TrainingSpec(
            name=name,
            config_url="standin:sleep=600",
            labels={
                "dagster/asset": "trained",
                "dagster/partition": "shared",
                "dagster/run-id": other,
            },
        ),
        name,
    )
    job["spec"]["suspend"] = True  # unfinished all the same; no pod needs to run for this test
    cluster.create_job(job)
    refused = launch_in_dagster(
        cluster.launcher(nnodes=1), "standin:ok", instance, partition="shared"
    )
    assert not refused.success and refused.job_name is None
    assert f"belongs to Dagster run {other}, which is still STARTED" in refused.logs
    assert "job" in cluster.leftovers(name, wait_s=0)  # untouched
    instance.delete_run(other)
    launched = launch_in_dagster(
        cluster.launcher(nnodes=1), "standin:ok", instance, partition="shared"
    )
    assert launched.success, launched.logs[-3000:]
    assert cluster.leftovers(name) == {}
