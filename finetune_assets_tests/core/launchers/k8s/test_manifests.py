"""Every manifest the k8s launcher renders and every file in deploy/ against the official OpenAPI
schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from finetune_assets.core.launchers import TrainingSpec
from finetune_assets.core.launchers.k8s import CONTAINER_NAME, JOB_LABEL
from finetune_assets.defs.resources.k8s_launcher import K8sTorchrunLauncher, Toleration

DEPLOY = Path(__file__).resolve().parents[4] / "deploy"
# The oldest version we support (podFailurePolicy is GA from 1.31) and a recent one.
K8S_VERSIONS = ["1.31", "1.35"]
SECRET = "s3cr3t-value-that-must-never-be-rendered"

CONFIGS = {
    "1-node-cpu": dict(nnodes=1),
    "2-nodes-cpu": dict(nnodes=2, env_secret_names=["finetune-credentials"]),
    "2-nodes-gpu": dict(
        nnodes=2,
        nproc_per_node=4,
        gpus_per_node=4,
        max_restarts=2,
        tolerations=[
            Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
            Toleration(
                key="pool",
                operator="Equal",
                value="train",
                effect="NoExecute",
                toleration_seconds=60,
            ),
        ],
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        env_secret_names=["finetune-mlflow", "finetune-s3"],
        service_account_name="finetune-trainer",
        image_pull_secrets=["regcred"],
        image_pull_policy="Always",
        shm_size="16Gi",
        cpu_request="8",
        cpu_limit="16",
        memory_request="64Gi",
        memory_limit="96Gi",
        labels={"team": "ml"},
        delete_propagation_policy="Foreground",
    ),
    "2-nodes-rwx-volume": dict(
        nnodes=2, storage_pvc_name="finetune-storage", storage_mount_path="/data"
    ),
    "8-nodes-no-limits": dict(
        nnodes=8, nproc_per_node=8, gpus_per_node=8, cpu_limit=None, memory_limit=None
    ),
    "2-nodes-passthrough-kueue": dict(
        nnodes=2,
        gpus_per_node=8,
        queue_name="gpu-queue",
        deployment="prod",
        # IPC_LOCK (RDMA memory registration) passes only a namespace enforcing 'privileged'
        pod_security_level="privileged",
        k8s_config={
            "pod_template_spec_metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}},
            "pod_spec_config": {
                "priorityClassName": "training-high",
                "schedulerName": "volcano",
                "runtimeClassName": "nvidia",
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "node.kubernetes.io/instance-type",
                                            "operator": "In",
                                            "values": ["p5.48xlarge"],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                },
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": "x"}},
                    }
                ],
            },
            "container_config": {
                "resources": {
                    "limits": {"vpc.amazonaws.com/efa": "32"},
                    "requests": {"vpc.amazonaws.com/efa": "32"},
                },
                "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
            },
            "job_metadata": {"annotations": {"team.example.com/owner": "ml"}},
        },
    ),
}


def render(name: str, **fields):
    launcher = K8sTorchrunLauncher(
        image="registry.example.com/finetune-assets:1.0", namespace="ml-train", **fields
    )
    job = TrainingSpec(
        name="finetuned_model/v2024.01 (retry)",
        config_url="s3://bucket/finetune/configs/run.json",
        labels={
            "dagster/run-id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
            "dagster/asset": "finetuned_model",
            "dagster/partition": "2024-01-01/ünïcode & spaces",
        },
        env={
            "MLFLOW_TRACKING_URI": "http://mlflow.ml:5000",
            "FINETUNE_ASSETS_ROOT": "s3://bucket/finetune",
        },
    )
    return launcher, launcher.render(job, name)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("config", CONFIGS)
def test_rendered_manifests_validate(config: str, version: str) -> None:
    _, (service, job) = render("ft-abc123", **CONFIGS[config])
    for manifest in filter(None, (service, job)):
        kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize("config", CONFIGS)
def test_rendered_job_shape(config: str) -> None:
    fields = CONFIGS[config]
    launcher, (service, job) = render("ft-abc123", **fields)
    nnodes = fields.get("nnodes", 1)
    spec = job["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == nnodes
    )
    rules = spec["podFailurePolicy"]["rules"]
    assert spec["backoffLimit"] == 0 and [r["action"] for r in rules] == ["Ignore", "FailJob"]
    # disruption is not the code's fault
    assert rules[0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert (
        spec["activeDeadlineSeconds"] == launcher.timeout_s and spec["ttlSecondsAfterFinished"] >= 0
    )
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert container["name"] == CONTAINER_NAME
    # security
    assert (
        pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    )
    sc = container["securityContext"]
    # (+ added ones)
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/dev/shm", "/tmp", "/cache"} <= mounts
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert "requests" in container["resources"]
    if fields.get("gpus_per_node"):
        gpus = str(fields["gpus_per_node"])
        assert (
            container["resources"]["requests"]["nvidia.com/gpu"]
            == gpus
            == container["resources"]["limits"]["nvidia.com/gpu"]
        )
    assert [e["secretRef"]["name"] for e in container.get("envFrom", [])] == fields.get(
        "env_secret_names", []
    )
    # labels link the pods to the Dagster run, asset and partition, and are valid label values
    labels = spec["template"]["metadata"]["labels"]
    assert labels["dagster/run-id"] == "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    assert labels["dagster/asset"] == "finetuned_model" and labels[JOB_LABEL] == "ft-abc123"
    assert all(len(v) <= 63 for v in labels.values())
    cmd = container["command"]
    if nnodes > 1:  # pod 0 hosts the c10d store on localhost; the others dial pod 0's DNS name
        assert cmd[:2] == ["sh", "-c"] and pod["shareProcessNamespace"] is True
        assert (
            f"then e=localhost:{launcher.rdzv_port}; else "
            f"e=ft-abc123-0.ft-abc123.ml-train.svc:{launcher.rdzv_port};" in cmd[2]
        )
        assert "--rdzv-endpoint" not in cmd[3:]
        cmd = cmd[3:]
    assert cmd[:3] == ["python", "-m", "torch.distributed.run"]
    assert cmd[-4:] == [
        "-m",
        "finetune_assets.core.training",
        "--config",
        "s3://bucket/finetune/configs/run.json",
    ]
    assert cmd[cmd.index("--nproc-per-node") + 1] == str(launcher.processes)
    assert cmd[cmd.index("--max-restarts") + 1] == str(fields.get("max_restarts", 0))
    if nnodes == 1:
        assert service is None and "--standalone" in cmd
        return
    # multi-node: c10d on pod 0 through the headless Service, unique rendezvous id
    assert cmd[cmd.index("--node-rank") + 1] == "$(JOB_COMPLETION_INDEX)"
    assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
    # longer than any pod start gap (torchrun's default read timeout is 60 s)
    timeout = launcher.rdzv_timeout_s
    assert (
        cmd[cmd.index("--rdzv-conf") + 1] == f"join_timeout={timeout},read_timeout={timeout}"
        and timeout >= 600
    )
    assert cmd[cmd.index("--rdzv-id") + 1] == "ft-abc123"
    assert pod["subdomain"] == service["metadata"]["name"] == "ft-abc123"
    assert (
        service["spec"]["clusterIP"] == "None"
        and service["spec"]["publishNotReadyAddresses"] is True
    )
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


def test_no_secret_values_in_manifests(monkeypatch) -> None:
    """Secrets are referenced by name; a credential in the launcher's own environment never leaks
    in.
    """
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    _, manifests = render("ft-abc123", **CONFIGS["2-nodes-gpu"])
    assert SECRET not in json.dumps(manifests)


@pytest.mark.parametrize("where", ["launcher", "job"])
def test_credentials_as_plain_env_are_refused(where: str) -> None:
    env = {"AWS_SECRET_ACCESS_KEY": SECRET}
    launcher = K8sTorchrunLauncher(image="img", env=env if where == "launcher" else {})
    job = TrainingSpec(name="x", config_url="c", env=env if where == "job" else {})
    with pytest.raises(ValueError, match="env_secret_names") as err:
        launcher.render(job, "x-1")
    assert SECRET not in str(err.value)


def test_names_and_labels_are_kubernetes_safe() -> None:
    from finetune_assets.core.launchers.k8s import k8s_name, sanitize_label_value

    for raw in ["finetuned_model/v1", "9-starts-with-digit", "x" * 200, "ÄÖÜ", "--"]:
        name = k8s_name(raw)
        assert (
            len(name) <= 47
            and name[0].isalpha()
            and name.replace("-", "").isalnum()
            and name.islower()
        )
    assert sanitize_label_value("2024-01-01/ünï code") == "2024-01-01--n--code"
    assert sanitize_label_value("-x-" * 40) == ("-x-" * 40)[:63].strip("-")
    with pytest.raises(ValueError, match="label key"):
        K8sTorchrunLauncher(image="img", labels={"bad key": "v"}).render(
            TrainingSpec(name="x", config_url="c"), "x-1"
        )


# -- deploy/ --------------------------------------------------------------------------------------

KUBE_FILES = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "values.yaml")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", KUBE_FILES, ids=lambda p: p.name)
def test_deploy_manifests_validate(path: Path, version: str) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs, f"{path} has no documents"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_deploy_folder_is_complete() -> None:
    names = {p.name for p in DEPLOY.iterdir()}
    assert {"Dockerfile", "rbac.yaml", "values.yaml", "secret.example.yaml", "README.md"} <= names


def test_helm_values_use_k8s_run_launcher_and_this_code_location() -> None:
    values = yaml.safe_load((DEPLOY / "values.yaml").read_text())
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"][:2] == ["-m", "finetune_assets.definitions"]
    assert "finetune-credentials" in deployment["envSecrets"][0]["name"]
    # the run pods launch the training Job: they use the ServiceAccount bound in rbac.yaml
    rbac = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    sa_names = {d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount"}
    run_sa = values["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]["podSpecConfig"][
        "serviceAccountName"
    ]
    assert run_sa in sa_names


def test_rbac_is_namespaced_and_minimal() -> None:
    from finetune_assets_tests.core.launchers.k8s.test_launcher_api import LAUNCHER_VERBS

    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    kinds = {d["kind"] for d in docs}
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    (role,) = [d for d in docs if d["kind"] == "Role"]
    granted = {
        (verb, f"{res}")
        for rule in role["rules"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    assert all("*" not in v and "*" not in r for v, r in granted)
    assert granted == LAUNCHER_VERBS
    for d in docs:
        assert d["metadata"]["namespace"] == role["metadata"]["namespace"]
    trainer = [
        d
        for d in docs
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "finetune-trainer"
    ]
    assert trainer and trainer[0]["automountServiceAccountToken"] is False


# -- GPUs: coherent processes, limits and /dev/shm  ----------------------------


def _container(**fields):
    _, (_, job) = render("ft-abc123", nnodes=2, **fields)
    pod = job["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def test_an_8_gpu_pod_renders_coherent_resources() -> None:
    from kubernetes.utils import parse_quantity

    pod, container = _container(gpus_per_node=8)
    cmd = container["command"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "8"  # one process per reserved GPU
    res = container["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "8"
    shm = parse_quantity(
        next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]
    )
    limit, request = (
        parse_quantity(res["limits"]["memory"]),
        parse_quantity(res["requests"]["memory"]),
    )
    # shm counts against the limit
    assert shm >= 8 * 2**30 and limit >= shm + 8 * 2**30 and request <= limit
    assert parse_quantity(res["requests"]["cpu"]) >= 8 and parse_quantity(
        res["limits"]["cpu"]
    ) >= parse_quantity(res["requests"]["cpu"])


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (dict(gpus_per_node=8, nproc_per_node=1), "7 reserved GPU(s) per pod would sit idle"),
        (dict(gpus_per_node=2, nproc_per_node=4), "4 processes would share 2 GPU(s)"),
        (
            dict(gpus_per_node=8, shm_size="32Gi", memory_limit="8Gi"),
            "raise memory_limit to at least 40Gi",
        ),
        (
            dict(memory_request="16Gi", memory_limit="8Gi"),
            "memory_request=16Gi is above memory_limit=8Gi",
        ),
        (dict(cpu_request="8", cpu_limit="2"), "cpu_request=8 is above cpu_limit=2"),
    ],
)
def test_incoherent_gpu_pods_are_refused_with_what_to_change(fields, says) -> None:
    with pytest.raises(ValueError) as err:
        _container(**fields)
    assert says in str(err.value)


def test_explicit_sizes_are_kept() -> None:
    _, container = _container(gpus_per_node=4, shm_size="16Gi", memory_limit="96Gi", cpu_limit=None)
    assert (
        container["resources"]["limits"]["memory"] == "96Gi"
        and "cpu" not in container["resources"]["limits"]
    )
