"""A Dagster run worker's Job on the cluster (the local plane: the real Job controller), as
``dagster_k8s.K8sRunLauncher`` builds and reads it.

The launcher's run Job is ``NonIndexed`` (the API default), one pod, ``backoffLimit: 0``. Run
monitoring acts on ``K8sRunLauncher.check_run_worker_health``: RUNNING while the pod runs, FAILED
once the pod was SIGKILLed (OOM kill, lost node: exit 137, the Job ``Failed``). The full path
(monitoring fails the run, the run retry finishes it) is ``test_deployment_backfill.py``.
"""

from __future__ import annotations

import signal
import sys
import time

import kubernetes
import yaml
from dagster._core.launcher import WorkerStatus
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
from dagster._core.utils import make_new_run_id
from dagster_k8s import K8sRunLauncher
from dagster_k8s.job import (
    DagsterK8sJobConfig,
    UserDefinedDagsterK8sConfig,
    construct_dagster_k8s_job,
    get_job_name_from_run_id,
)

from finetune_assets_tests.core.launchers.k8s.plane import REPO

IMAGE = "finetune-assets:test"


def _run_k8s_config() -> UserDefinedDagsterK8sConfig:
    """The chart's ``runK8sConfig`` from deploy/values.yaml: what makes the run pod pass the
    namespace's Pod Security level (deploy/namespace.yaml enforces "restricted").
    """
    values = yaml.safe_load((REPO / "deploy" / "values.yaml").read_text())
    run = values["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]
    return UserDefinedDagsterK8sConfig(
        pod_spec_config={"securityContext": run["podSpecConfig"]["securityContext"]},
        container_config={"securityContext": run["containerConfig"]["securityContext"]},
    )


def _wait(check, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


def test_a_sigkilled_run_pod_fails_the_job_and_the_launchers_health_check(cluster, instance):
    launcher = K8sRunLauncher(
        service_account_name="finetune-launcher",
        instance_config_map="dagster-instance",
        dagster_home="/opt/dagster/dagster_home",
        job_image=IMAGE,
        load_incluster_config=False,
        kubeconfig_file=cluster.kubeconfig,
        job_namespace=cluster.namespace,
    )
    launcher.register_instance(instance)  # it counts the run's resume attempts there
    run = DagsterRun(job_name="x", run_id=make_new_run_id(), status=DagsterRunStatus.STARTED)
    instance.add_run(run)
    name = get_job_name_from_run_id(run.run_id)
    job = construct_dagster_k8s_job(
        job_config=DagsterK8sJobConfig(
            job_image=IMAGE,
            dagster_home="/opt/dagster/dagster_home",
            instance_config_map="dagster-instance",
            service_account_name="finetune-launcher",
        ),
        args=[sys.executable, "-c", "import time; time.sleep(120)"],  # a run worker, busy
        job_name=name,
        user_defined_k8s_config=_run_k8s_config(),
        component="run_worker",
        labels={"dagster/run-id": run.run_id},
    )
    manifest = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    assert "completionMode" not in manifest["spec"] and manifest["spec"]["backoffLimit"] == 0
    cluster.create_job(manifest)
    core, batch = cluster._apis()  # noqa: SLF001 - the harness' clients

    def running_pod():
        pods = core.list_namespaced_pod(cluster.namespace, label_selector=f"job-name={name}").items
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    pod = _wait(running_pod)
    assert pod.metadata.name.startswith(f"{name}-")
    assert "batch.kubernetes.io/job-completion-index" not in (pod.metadata.labels or {})
    assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING

    cluster.kill_pod(pod.metadata.name, signal.SIGKILL)
    health = _wait(
        lambda: (h := launcher.check_run_worker_health(run)).status == WorkerStatus.FAILED and h
    )
    assert "no active pods" in health.msg
    # what monitoring adds to the run's failure: the pod's state and the container's last lines
    info = launcher.get_run_worker_debug_info(run, include_container_logs=True)
    assert "Pod status: Failed" in info and "Terminated with exit code 137" in info
    dead = core.read_namespaced_pod(pod.metadata.name, cluster.namespace)
    assert dead.status.phase == "Failed"
    assert dead.status.container_statuses[0].state.terminated.exit_code == 137
    status = batch.read_namespaced_job_status(name, cluster.namespace).status
    assert (status.failed, status.active or 0) == (1, 0)  # the API server omits a zero
    assert {c.type for c in status.conditions} >= {"FailureTarget", "Failed"}
    assert status.completed_indexes is None
    assert cluster.leftovers(name, wait_s=0)["job"] == [name]  # a failed Job stays (its TTL)
    batch.delete_namespaced_job(name, cluster.namespace, propagation_policy="Background")
    assert not cluster.leftovers(name)
