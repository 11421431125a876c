"""Kueue on the real plane: preemption survived, queued Jobs stopped the Kueue way.

Kueue preempts by suspending the Job: the Job controller deletes the pods, which die by SIGTERM
without a ``DisruptionTarget`` condition, and Kueue un-suspends the same Job when it re-admits the
Workload. So the gang must (1) not be failed by its own ``podFailurePolicy`` while suspended,
(2) wait while queued again, ignoring the pods that the suspension killed, and (3) resume from its
checkpoint when the new pods start. Run on the real Job controller and the real Kueue manager.
"""

from __future__ import annotations

import contextlib
import re
import threading

import pytest

from finetune_assets_tests.core.launchers.k8s.conftest import free_port
from finetune_assets_tests.core.launchers.k8s.helpers import Launched, launch_in_dagster
from finetune_assets_tests.core.launchers.k8s.plane_objects import (
    apis,
    cluster_in,
    kueue_queues,
    namespace,
    tag,
    wait_for,
    workloads,
)

pytestmark = pytest.mark.control_plane

PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GANG_STANDIN = "finetune_assets_tests.core.launchers.k8s.gang_standin"


def gang_launcher(plane, ns: str, **kw):
    """A 2-pod x 4-GPU gang of the stand-in trainer (the node agents' GPUs are counted, not real:
    no CUDA preflight).
    """
    fields = dict(
        trainer_module=GANG_STANDIN,
        nnodes=2,
        gpus_per_node=4,
        cuda_preflight=False,
        rdzv_port=free_port(),
        shm_size="256Mi",
        memory_limit="6Gi",
        cpu_limit="4",
        timeout_s=600,
        start_timeout_s=300,
        rdzv_timeout_s=300,
        queue_timeout_s=300,
    )
    return cluster_in(plane, ns).launcher(**{**fields, **kw})


def in_thread(fn) -> tuple[threading.Thread, list[Launched]]:
    out: list[Launched] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def journal(folder) -> str:
    return (folder / "journal").read_text()


def step(ckpt) -> int:
    try:
        return int(ckpt.read_text())
    except (FileNotFoundError, ValueError):
        return 0


def their_job(name: str, queue: str, priority: str, gpus: int) -> dict:
    """A production Job of one pod: admitted by Kueue (its webhook suspends it at creation)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": queue, PRIORITY_LABEL: priority},
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "prod",
                            "image": "finetune-assets:test",
                            "command": ["python", "-c", "import time; time.sleep(2)"],
                            "resources": {
                                "requests": {
                                    "cpu": "100m",
                                    "memory": "64Mi",
                                    "nvidia.com/gpu": str(gpus),
                                },
                                "limits": {"memory": "256Mi", "nvidia.com/gpu": str(gpus)},
                            },
                        }
                    ],
                }
            },
        },
    }


def test_a_gang_preempted_by_kueue_is_readmitted_and_resumes_from_its_checkpoint(
    control_plane, instance, tmp_path
) -> None:
    ns = namespace(control_plane, "kq-preempt")
    t = tag()
    q = kueue_queues(control_plane, ns, t)
    _, batch, _ = apis(control_plane)
    ckpt = tmp_path / "step"
    launcher = gang_launcher(
        control_plane, ns, queue_name=q["research"], labels={PRIORITY_LABEL: q["low"]}
    )
    thread, result = in_thread(
        lambda: launch_in_dagster(
            launcher, f"standin:train=100,step_s=0.2,term_s=8,hold_at=3,dir={tmp_path}", instance
        )
    )
    # ours holds all 8 GPUs of the cohort (4 borrowed from production) and trains
    wait_for("our gang to checkpoint step 3", lambda: step(ckpt) >= 3 or not thread.is_alive())
    assert thread.is_alive(), result[0].logs[-3000:]
    batch.create_namespaced_job(ns, their_job(f"prod-{t}", q["production"], q["high"], 4))

    def their_job_complete() -> bool:
        conds = batch.read_namespaced_job(f"prod-{t}", ns).status.conditions or []
        return any(c.type == "Complete" and c.status == "True" for c in conds)

    wait_for("the production Job to be admitted and complete", their_job_complete, 300)
    thread.join(timeout=600)
    assert result, "the launch did not return"
    launched = result[0]
    assert launched.success, launched.logs[-6000:]
    # Kueue evicted our Workload for the production one (the launcher says so, in Kueue's words),
    # then admitted the same Job again
    assert re.search(
        r"was preempted by Kueue \(InCohortReclamation: Preempted to accommodate", launched.logs
    ), launched.logs[-4000:]
    # resumed from the checkpoint the first pods wrote last (their SIGTERM grace included)
    resumes = [int(m) for m in re.findall(r"rank=0 \S+ resumes at step (\d+)", launched.logs)]
    accepted = [int(m) for m in re.findall(r"accepted \S+ step=(\d+)", journal(tmp_path))]
    assert len(resumes) == 2 and resumes[0] == 0, resumes
    assert resumes[1] >= 3 and resumes[1] == accepted[resumes[1] - 1], (resumes, accepted)
    assert "trained global_step=100" in launched.logs
    assert "resubmitting" not in launched.logs


NO_DELETE_ROLE = [  # deploy/rbac.yaml's verbs, less jobs delete: every delete of the Job fails
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list", "patch"]},
]


def test_a_kueue_job_that_cannot_be_deleted_is_stopped_by_deactivating_its_workload(
    control_plane, instance, tmp_path
) -> None:
    """Suspending an admitted Kueue Job does not stop it (Kueue un-suspends it); deactivating its
    Workload does, and for good.
    """
    import kubernetes

    from finetune_assets_tests.core.launchers.k8s.plane_objects import service_account_kubeconfig

    ns = namespace(control_plane, "kq-stop")
    q = kueue_queues(control_plane, ns, tag())
    client = control_plane.api_client()
    rbac = kubernetes.client.RbacAuthorizationV1Api(client)
    with contextlib.suppress(kubernetes.client.ApiException):
        rbac.create_namespaced_role(
            ns, {"metadata": {"name": "no-delete"}, "rules": NO_DELETE_ROLE}
        )
        rbac.create_namespaced_role_binding(
            ns,
            {
                "metadata": {"name": "no-delete"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "no-delete",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "no-delete", "namespace": ns}],
            },
        )
    kubeconfig = service_account_kubeconfig(control_plane, ns, "no-delete", tmp_path / "kc")
    # 3 x 4 GPUs: more than the cohort's 8, so Kueue never admits it and the queue timeout ends
    # the launch while the Job is queued
    launcher = gang_launcher(
        control_plane,
        ns,
        kubeconfig_file=kubeconfig,
        queue_name=q["research"],
        queue_timeout_s=10,
        api_outage_budget_s=5,
        nnodes=3,
    )
    launched = launch_in_dagster(launcher, "standin:sleep=600", instance)
    assert not launched.success and "not admitted within queue_timeout_s=10" in launched.logs
    assert "deactivated its Kueue Workload" in launched.logs, launched.logs[-3000:]
    core, batch, _ = apis(control_plane)
    name = launched.job_name

    def stopped_for_good() -> bool:
        (wl,) = [
            w
            for w in workloads(control_plane, ns)
            if w["metadata"]["ownerReferences"][0]["name"] == name
        ]
        pods = core.list_namespaced_pod(ns, label_selector=f"finetune-assets/training-job={name}")
        job = batch.read_namespaced_job(name, ns)
        return (
            wl["spec"]["active"] is False
            and job.spec.suspend is True
            and not [p for p in pods.items if p.status.phase in ("Pending", "Running")]
        )

    wait_for("the Workload deactivated, the Job suspended, its pods gone", stopped_for_good, 120)
