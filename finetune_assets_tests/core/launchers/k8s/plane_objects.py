"""Objects the real-plane tests of issue 35 set up: namespaces, Kueue queues, ServiceAccounts.

Kept beside (not in) conftest.py: the fixtures there give "a cluster"; these give the pieces a
test of Kueue, RBAC or Pod Security arranges on the plane itself, with the admin identity.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from finetune_assets_tests.core.launchers.k8s.conftest import Cluster, ControlPlane

KUEUE = ("kueue.x-k8s.io", "v1beta2")


def wait_for(what: str, check, timeout: float = 180.0, every: float = 0.5):
    """Poll ``check`` until it returns something truthy (a bound, not a timed assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def apis(plane: ControlPlane):
    client = plane.api_client()
    return (
        kubernetes.client.CoreV1Api(client),
        kubernetes.client.BatchV1Api(client),
        kubernetes.client.CustomObjectsApi(client),
    )


def namespace(plane: ControlPlane, name: str, labels: dict[str, str] | None = None) -> str:
    """A namespace with its ``default`` ServiceAccount made (the real controller makes it)."""
    core, _, _ = apis(plane)
    with contextlib.suppress(kubernetes.client.ApiException):
        core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})

    def has_default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
            return True
        except kubernetes.client.ApiException:
            return False

    wait_for(f"the default ServiceAccount of {name}", has_default_sa, 60)
    return name


def cluster_in(plane: ControlPlane, ns: str, **kw: Any) -> Cluster:
    return Cluster(kubeconfig=plane.kubeconfig, namespace=ns, image="finetune-assets:test", **kw)


def kueue_queues(plane: ControlPlane, ns: str, tag: str, gpus: int = 4) -> dict[str, str]:
    """Two ClusterQueues in one cohort, ``gpus`` nominal each: the research queue may borrow the
    production queue's, which production reclaims by preempting
    (``reclaimWithinCohort: Any``); a LocalQueue for each in ``ns`` and two priority classes.
    Returns the names.
    """
    _, _, custom = apis(plane)
    group, version = KUEUE
    names = {
        "flavor": f"flavor-{tag}",
        "cohort": f"cohort-{tag}",
        "research": f"research-{tag}",
        "production": f"production-{tag}",
        "low": f"low-{tag}",
        "high": f"high-{tag}",
    }

    def create(plural: str, body: dict[str, Any], namespaced: bool = False) -> None:
        body = {"apiVersion": f"{group}/{version}", **body}
        try:
            if namespaced:
                custom.create_namespaced_custom_object(group, version, ns, plural, body)
            else:
                custom.create_cluster_custom_object(group, version, plural, body)
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise

    create("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": names["flavor"]}})
    for queue in ("research", "production"):
        create(
            "clusterqueues",
            {
                "kind": "ClusterQueue",
                "metadata": {"name": names[queue]},
                "spec": {
                    "cohortName": names["cohort"],
                    "namespaceSelector": {},
                    "preemption": {
                        "reclaimWithinCohort": "Any",
                        "withinClusterQueue": "LowerPriority",
                    },
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": names["flavor"],
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "32"},
                                        {"name": "memory", "nominalQuota": "256Gi"},
                                        {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        )
        create(
            "localqueues",
            {
                "kind": "LocalQueue",
                "metadata": {"name": names[queue], "namespace": ns},
                "spec": {"clusterQueue": names[queue]},
            },
            namespaced=True,
        )
    for cls, value in (("low", 10), ("high", 1000)):
        create(
            "workloadpriorityclasses",
            {
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": names[cls]},
                "value": value,
                "description": f"issue 35 test ({cls})",
            },
        )

    def active(queue: str) -> bool:
        cq = custom.get_cluster_custom_object(group, version, "clusterqueues", names[queue])
        return any(
            c["type"] == "Active" and c["status"] == "True"
            for c in (cq.get("status") or {}).get("conditions") or []
        )

    wait_for("both ClusterQueues Active", lambda: active("research") and active("production"))
    return names


def workloads(plane: ControlPlane, ns: str) -> list[dict[str, Any]]:
    _, _, custom = apis(plane)
    return custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]


def service_account_kubeconfig(plane: ControlPlane, ns: str, sa: str, path: Path) -> str:
    """A kubeconfig that authenticates as ``ns/sa`` (a bound token from the TokenRequest API), so
    the launcher runs with exactly the RBAC a deployment gives it.
    """
    core, _, _ = apis(plane)
    with contextlib.suppress(kubernetes.client.ApiException):
        core.create_namespaced_service_account(ns, {"metadata": {"name": sa}})
    token = core.create_namespaced_service_account_token(
        sa, ns, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    admin = json.loads(Path(plane.kubeconfig).read_text())
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "clusters": admin["clusters"],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [
            {
                "name": "sa",
                "context": {"cluster": admin["clusters"][0]["name"], "user": sa, "namespace": ns},
            }
        ],
    }
    path.write_text(json.dumps(cfg))
    return str(path)


def apply_yaml(plane: ControlPlane, path: Path, namespace_override: str | None = None) -> list:
    """``kubectl apply -f`` of a file of manifests, unchanged except the namespace (create only)."""
    client = plane.api_client()
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    out = []
    for doc in docs:
        if namespace_override and doc.get("metadata", {}).get("namespace"):
            doc["metadata"]["namespace"] = namespace_override
        out += kubernetes.utils.create_from_dict(client, doc)
    return out


def tag() -> str:
    return uuid.uuid4().hex[:6]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
