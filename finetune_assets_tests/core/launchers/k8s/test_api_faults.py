"""The launcher survives the API server's troubles, made by the real components of the local plane:

- 429 with ``Retry-After`` from the API server's own priority and fairness (a FlowSchema puts the
  launcher's ServiceAccount on a priority level without seats while another user's slow request
  holds it: ``plane.rejected_by_apf``);
- an outage: etcd killed under the running API server and started again (``plane.etcd_down``):
  the API server holds requests meanwhile (no 5xx: a 3 s outage is a slow answer to the launcher);
- Job deletes refused with 500 by a validating admission webhook (a failing policy engine: the
  only part the test serves itself, through the real admission chain, ``plane.AdmissionHooks``).

The launcher authenticates as the run pods' ServiceAccount ``finetune-launcher`` with a token from
the TokenRequest API, so deploy/rbac.yaml's Role is what it may do (RBAC enforced).
Not made here: a connection reset mid-response and a transient 401 (no real component does
those on purpose; the retry wrapper's handling of them is the unit test below and
``RETRIED_STATUS``).
"""

from __future__ import annotations

import re
import threading
import time

import kubernetes
import pytest

from finetune_assets.core.launchers.k8s.api import ApiOutage, call
from finetune_assets_tests.core.launchers.k8s.conftest import Cluster
from finetune_assets_tests.core.launchers.k8s.helpers import launch_in_dagster
from finetune_assets_tests.core.launchers.k8s.plane import (
    AdmissionHooks,
    apf_rejections,
    etcd_down,
    rejected_by_apf,
    token_kubeconfig,
    wait_until,
)

pytestmark = pytest.mark.k8s

LAUNCHER_SA = "finetune-launcher"
HOG_NS, HOG_SA = "apf-hog", "hog"


@pytest.fixture(scope="module")
def troubles(k8s_cluster: Cluster, tmp_path_factory):
    """The launcher's token kubeconfig, the webhook, and a second user (``apf-hog/hog``) whose
    ConfigMap creates the webhook holds.
    """
    plane = k8s_cluster.plane
    if plane is None:
        pytest.skip("makes its faults with the local control plane's components")
    client = plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    rbac = kubernetes.client.RbacAuthorizationV1Api(client)
    for create in (
        lambda: core.create_namespace({"metadata": {"name": HOG_NS}}),
        lambda: core.create_namespaced_service_account(HOG_NS, {"metadata": {"name": HOG_SA}}),
        lambda: rbac.create_namespaced_role(
            HOG_NS,
            {
                "metadata": {"name": HOG_SA},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}],
            },
        ),
        lambda: rbac.create_namespaced_role_binding(
            HOG_NS,
            {
                "metadata": {"name": HOG_SA},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": HOG_SA,
                },
                "subjects": [{"kind": "ServiceAccount", "name": HOG_SA, "namespace": HOG_NS}],
            },
        ),
    ):
        try:
            create()
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
    root = tmp_path_factory.mktemp("api-faults")
    launcher_kc = token_kubeconfig(plane, root / "launcher", k8s_cluster.namespace, LAUNCHER_SA)
    hog_kc = token_kubeconfig(plane, root / "hog", HOG_NS, HOG_SA)
    user = f"system:serviceaccount:{k8s_cluster.namespace}:{LAUNCHER_SA}"
    with AdmissionHooks(
        plane, k8s_cluster.namespace, user, HOG_NS, f"system:serviceaccount:{HOG_NS}:{HOG_SA}"
    ) as hooks:
        hooks.launcher_kubeconfig, hooks.hog_kubeconfig = launcher_kc, hog_kc
        yield hooks


def _hog(kubeconfig: str, stop: threading.Event) -> None:
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
    while not stop.is_set():
        try:
            core.create_namespaced_config_map(HOG_NS, {"metadata": {"generateName": "hog-"}})
        except kubernetes.client.ApiException:
            pass  # its own 429s when the launcher's request holds the level


def test_training_survives_real_429s_an_etcd_outage_and_failing_deletes(
    cluster: Cluster, troubles: AdmissionHooks, instance, tmp_path
) -> None:
    """Once the pod trains (it holds at step 1 until released): API priority and fairness refuses
    the launcher with 429 (Retry-After) until at least 3 of its requests were refused (its
    FlowSchema's count: the hog's own 429s are counted apart), then etcd is down for 3 s: the gang
    is never torn down and, released, trains every step. Then the Job delete is refused twice
    (500): retried, the gang is removed.
    """
    plane, hooks = cluster.plane, troubles
    hooks.fail_deletes = 2
    ckpt, release = tmp_path / "ckpt", tmp_path / "release"
    launcher = cluster.launcher(
        nnodes=1, api_outage_budget_s=90, kubeconfig_file=hooks.launcher_kubeconfig
    )
    out: dict = {}
    runner = threading.Thread(
        target=lambda: out.update(
            launched=launch_in_dagster(
                launcher,
                f"standin:train=4,step_s=0.2,hold_at=1,hold_s=400,release={release},ckpt={ckpt}",
                instance,
            )
        )
    )
    runner.start()

    def step() -> int:
        text = ckpt.read_text().strip() if ckpt.exists() else ""
        return int(text) if text.isdigit() else 0

    wait_until(lambda: step() >= 1 or not runner.is_alive(), 180, "the pod trains")
    steps = {"faults_from": step()}
    try:
        subjects = [(cluster.namespace, LAUNCHER_SA), (HOG_NS, HOG_SA)]
        with rejected_by_apf(plane, subjects) as (flow, _):
            hooks.hold_s = 1.0
            stop = threading.Event()
            hog = threading.Thread(target=_hog, args=(hooks.hog_kubeconfig, stop), daemon=True)
            hog.start()
            try:
                wait_until(lambda: apf_rejections(plane, flow) >= 3, 120, "APF rejecting", 0.5)
            finally:
                stop.set()
                hog.join(30)
                hooks.hold_s = 0.0
        rejected = apf_rejections(plane, flow)
        # etcd gone: the API server holds the requests it cannot serve (no error within the
        # launcher's 30 s request timeout); the supervision loop waits, the gang lives on
        with etcd_down(plane):
            time.sleep(3.0)  # how long the outage lasts (no assertion on time)
        steps["faults_until"] = step()
    finally:
        release.touch()  # also after a failure here: the gang must not hold till hold_s
    runner.join(600)
    launched = out["launched"]

    assert launched.success, launched.logs
    assert steps == {"faults_from": 1, "faults_until": 1}  # the faults came while the gang held
    assert ckpt.read_text().strip() == "4", steps  # every step ran: one gang, never restarted
    # the launcher's own requests were refused (its FlowSchema's count; which of its threads got
    # them decides whether the Dagster log shows a "429 ...; retrying": only the launching
    # thread writes there) and it went on
    assert rejected >= 3
    assert launched.logs.count("Launching training Job") == 1
    name = launched.job_name
    assert hooks.refused == [f"{cluster.namespace}/{name}"] * 2
    assert re.search(r"delete job: 500 Internal Server Error; retrying", launched.logs)
    assert f"Deleted Job {cluster.namespace}/{name}" in launched.logs
    assert cluster.leftovers(name) == {}


def test_a_job_that_cannot_be_deleted_is_suspended_and_the_log_says_so(
    cluster: Cluster, troubles: AdmissionHooks, instance
) -> None:
    """Deletes keep failing past the outage budget: the Job is suspended, the real Job controller
    terminates its pod, the Job object stays. (The pod cannot be scheduled, so the launch fails at
    its start timeout.)
    """
    hooks = troubles
    hooks.fail_deletes = 1000
    launcher = cluster.launcher(
        nnodes=1,
        api_outage_budget_s=2,
        start_timeout_s=2,
        kubeconfig_file=hooks.launcher_kubeconfig,
        node_selector={"finetune.test/no-such-node": "true"},
    )
    try:
        launched = launch_in_dagster(launcher, "standin:ok", instance)
        assert not launched.success
        name = launched.job_name
        assert re.search(
            rf"Could not delete Job {cluster.namespace}/{name} .*suspended it instead",
            launched.logs,
        ), launched.logs
        _, batch = cluster._apis()  # noqa: SLF001 - the harness' clients
        assert batch.read_namespaced_job(name, cluster.namespace).spec.suspend is True
        left = wait_until(
            lambda: (got := cluster.leftovers(name, wait_s=0)).keys() == {"job"} and got,
            60,
            "the suspended Job's pods gone",
        )
        assert left == {"job": [name]}
    finally:
        hooks.fail_deletes = 0
    batch.delete_namespaced_job(name, cluster.namespace, propagation_policy="Background")
    assert cluster.leftovers(name) == {}


def test_the_api_wrapper_gives_up_after_the_budget_and_never_retries_a_client_error() -> None:
    attempts = []

    def unavailable(**_):
        attempts.append(1)
        raise kubernetes.client.ApiException(status=503, reason="ServiceUnavailable")

    with pytest.raises(ApiOutage, match="read job failed for 1s"):
        call(unavailable, budget_s=1.0, what="read job")
    assert 2 <= len(attempts) <= 4  # 0.5 s, then 1 s back-off

    def forbidden(**_):
        attempts.append(1)
        raise kubernetes.client.ApiException(status=403, reason="Forbidden")

    attempts.clear()
    with pytest.raises(kubernetes.client.ApiException):
        call(forbidden, budget_s=5.0, what="list pods")
    assert len(attempts) == 1
