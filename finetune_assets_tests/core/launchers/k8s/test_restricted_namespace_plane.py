"""``deploy/*.yaml`` on the real API server: applied unchanged, a namespace enforcing Pod Security
``restricted``, RBAC plus a ValidatingAdmissionPolicy that let the launcher's ServiceAccount
create Jobs only as the trainer ServiceAccount with the named Secrets, and the 2-node x 8-GPU
gang, created by that ServiceAccount, admitted and placed by the real scheduler on two GPU nodes.
"""

from __future__ import annotations

import copy
import json
import threading
import time

import kubernetes
import pytest

from finetune_assets.core.launchers import TrainingSpec
from finetune_assets_tests.core.launchers.k8s.conftest import REPO, Cluster, free_port
from finetune_assets_tests.core.launchers.k8s.helpers import launch_in_dagster
from finetune_assets_tests.core.launchers.k8s.plane_objects import (
    apis,
    apply_yaml,
    service_account_kubeconfig,
    wait_for,
)

pytestmark = pytest.mark.control_plane

DEPLOY = REPO / "deploy"
NS, LAUNCHER_SA, TRAINER_SA, SECRET = (
    "finetune",
    "finetune-launcher",
    "finetune-trainer",
    "finetune-credentials",
)


@pytest.fixture(scope="module")
def deployed(control_plane, tmp_path_factory) -> tuple[str, object]:
    """Every manifest of deploy/ (values.yaml is Helm's, not one) applied as it is, as an admin;
    then a kubeconfig of the launcher's ServiceAccount.
    """
    core, _, _ = apis(control_plane)
    try:
        core.read_namespace(NS)
    except kubernetes.client.ApiException:
        apply_yaml(control_plane, DEPLOY / "namespace.yaml")
        for name in sorted(p.name for p in DEPLOY.glob("*.yaml")):
            if name not in ("namespace.yaml", "values.yaml"):
                apply_yaml(control_plane, DEPLOY / name)
    kubeconfig = service_account_kubeconfig(
        control_plane, NS, LAUNCHER_SA, tmp_path_factory.mktemp("sa") / "launcher.kubeconfig"
    )
    batch = kubernetes.client.BatchV1Api(_client(kubeconfig))
    gang = _gang_manifest(kubeconfig)
    # the API server loads admission policies asynchronously: wait until the binding denies
    wait_for(
        "the ValidatingAdmissionPolicy to be enforced",
        lambda: _refused(batch, gang, "default"),
        60,
    )
    return kubeconfig, batch, gang


def _client(kubeconfig: str):
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return kubernetes.client.ApiClient(cfg)


def _launcher(kubeconfig: str, **kw):
    return Cluster(kubeconfig=kubeconfig, namespace=NS, image="finetune-assets:test").launcher(
        service_account_name=TRAINER_SA,
        env_secret_names=[SECRET],
        cpu_request="auto",  # the defaults: Guaranteed QoS
        memory_request="auto",
        memory_limit="auto",
        **kw,
    )


def _gang_manifest(kubeconfig: str) -> dict:
    launcher = _launcher(kubeconfig, nnodes=2, gpus_per_node=8, cuda_preflight=False)
    spec = TrainingSpec(name="refused", config_url="standin:ok", labels={}, env={})
    _, job = launcher.render(spec, "refused-gang", "finetune-assets:test")
    job["spec"]["suspend"] = True  # never runs, even if admitted
    return job


def _refused(
    batch, gang: dict, service_account: str, extra_secret: str | None = None
) -> str | None:
    """The API server's refusal of the launcher's gang with these changes, or None (created)."""
    job = copy.deepcopy(gang)
    pod = job["spec"]["template"]["spec"]
    pod["serviceAccountName"] = service_account
    if extra_secret:
        pod["containers"][0]["envFrom"].append({"secretRef": {"name": extra_secret}})
    job["metadata"]["name"] = f"probe-{free_port()}"
    try:
        batch.create_namespaced_job(NS, job)
    except kubernetes.client.ApiException as e:
        if e.status in (403, 422):
            return json.loads(e.body)["message"]
        raise
    batch.delete_namespaced_job(job["metadata"]["name"], NS, propagation_policy="Foreground")
    return None


def test_the_deploy_namespace_enforces_restricted(control_plane, deployed) -> None:
    core, _, _ = apis(control_plane)
    labels = core.read_namespace(NS).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # and the real PodSecurity admission refuses what restricted forbids, there
    pod = {
        "metadata": {"name": "root-probe"},
        "spec": {"containers": [{"name": "c", "image": "x", "command": ["true"]}]},
    }
    with pytest.raises(kubernetes.client.ApiException) as e:
        core.create_namespaced_pod(NS, pod)
    message = json.loads(e.value.body)["message"]
    assert e.value.status == 403 and 'violates PodSecurity "restricted:latest"' in message


def test_another_service_account_or_an_extra_secret_is_refused_by_the_api_server(
    deployed,
) -> None:
    _, batch, gang = deployed
    other_sa = _refused(batch, gang, "default")
    assert other_sa and "only with serviceAccountName finetune-trainer, not default" in other_sa
    assert "finetune-launcher-jobs" in other_sa  # the policy's name, from the API server
    extra = _refused(batch, gang, TRAINER_SA, extra_secret="postgresql")
    assert extra and "envFrom may reference only the allowed Secrets" in extra
    assert _refused(batch, gang, TRAINER_SA) is None  # the launcher's own gang is admitted


def test_the_2x8_gpu_gang_created_as_the_launcher_runs_on_two_gpu_nodes(
    control_plane, deployed, instance
) -> None:
    kubeconfig, _, _ = deployed
    core, _, _ = apis(control_plane)
    launcher = _launcher(
        kubeconfig, nnodes=2, gpus_per_node=8, cuda_preflight=False, rdzv_port=free_port()
    )
    seen: dict[str, object] = {}

    def watch_pods() -> None:
        while not seen.get("done"):
            for p in core.list_namespaced_pod(NS).items:
                if p.spec.node_name:
                    seen[p.metadata.name] = p
            time.sleep(0.5)

    t = threading.Thread(target=watch_pods, daemon=True)
    t.start()
    try:
        launched = launch_in_dagster(launcher, "standin:allreduce", instance)
    finally:
        seen["done"] = True
        t.join(timeout=10)
    assert launched.success, launched.logs[-6000:]
    assert "standin: allreduce=136 world=16" in launched.logs  # 16 ranks: 1+2+...+16
    pods = [p for k, p in seen.items() if k != "done"]
    assert len(pods) == 2
    assert {p.spec.node_name for p in pods} == {"fa-node-1", "fa-node-2"}
    for p in pods:
        assert p.spec.service_account_name == TRAINER_SA
        assert p.status.qos_class == "Guaranteed"
        limits = p.spec.containers[0].resources.limits
        assert limits["nvidia.com/gpu"] == "8"


def test_a_jobset_is_held_to_the_same_rules(deployed) -> None:
    """backend ``jobset``: the JobSet controller creates the child Jobs, so the policy on Jobs
    never sees them; ``finetune-launcher-jobsets`` refuses the JobSet itself.
    """
    from finetune_assets.core.launchers.k8s.jobset import GROUP, PLURAL, VERSION

    kubeconfig, _, _ = deployed
    custom = kubernetes.client.CustomObjectsApi(_client(kubeconfig))
    launcher = _launcher(kubeconfig, backend="jobset", nnodes=2)
    spec = TrainingSpec(name="refused", config_url="standin:ok", labels={}, env={})

    def refused(service_account: str) -> str | None:
        body = launcher.render_jobset(spec, f"probe-{free_port()}", "finetune-assets:test")
        body["spec"]["suspend"] = True  # never runs, even if admitted
        pod = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod["serviceAccountName"] = service_account
        try:
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body)
        except kubernetes.client.ApiException as e:
            if e.status in (403, 422):
                return json.loads(e.body)["message"]
            raise
        custom.delete_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, body["metadata"]["name"], propagation_policy="Foreground"
        )
        return None

    other_sa = wait_for("the JobSet policy to be enforced", lambda: refused("default"), 60)
    assert "finetune-launcher-jobsets" in other_sa and "finetune-trainer" in other_sa
    assert refused(TRAINER_SA) is None  # the launcher's own JobSet is admitted
