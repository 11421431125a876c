"""The local control plane of ``.ci/k8s/control-plane`` as the tests hold it: start, stop, and the
few things a test does to the machine under it (SIGKILL a pod's processes, stop a component, see
which pod processes live). Shared by the k8s fixtures and the deployment test (another package).

Everything a test asks about Kubernetes goes through the API server; only what a kubelet or an
operator would do on the host (a process killed by the kernel, a node or etcd going away) goes
through the pid files the plane writes (``DIR/pids/<component>.pid``,
``DIR/pids/pod-<uid8>-<container>.pid`` for pod processes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes

REPO = Path(__file__).resolve().parents[3]
CONTROL_PLANE = REPO / ".ci" / "k8s" / "control-plane"
PLANE_DIR_ENV = "FINETUNE_K8S_PLANE_DIR"


def binaries_built() -> bool:
    """Whether the plane's binaries for this checkout's ``.ci/k8s`` are in the cache (a start
    then takes seconds, not a build's many minutes).
    """
    r = subprocess.run(
        [sys.executable, str(CONTROL_PLANE), "built"], capture_output=True, text=True, check=False
    )
    return r.returncode == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


@dataclass
class ControlPlane:
    """The local control plane: upstream etcd, kube-apiserver, kube-controller-manager,
    kube-scheduler and Kueue, with node agents running pods as processes.
    """

    dir: Path
    kubeconfig: str

    def api_client(self) -> Any:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=self.kubeconfig, client_configuration=cfg)
        return kubernetes.client.ApiClient(cfg)

    def pids(self) -> dict[str, int]:
        """Every process the plane started and still has a pid file for (pods included)."""
        out = {}
        for f in (self.dir / "pids").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                out[f.stem] = int(f.read_text())
        return out

    def live_pod_processes(self, namespace: str | None = None, prefix: str = "") -> list[str]:
        """``<pod>/<container>`` of every pod process still running on the nodes (the node
        agent's pid files, ``pod-<uid8>-<ns>_<pod>_<container>``), of one namespace and pods
        whose name starts with ``prefix`` if given.
        """
        out = []
        for key, pid in self.pids().items():
            if not key.startswith("pod-") or key.count("_") != 2 or not _alive(pid):
                continue
            ns, pod, container = key.split("-", 2)[2].split("_")
            if (namespace is None or ns == namespace) and pod.startswith(prefix):
                out.append(f"{pod}/{container}")
        return sorted(out)

    def kill_pod(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> list[str]:
        """What the kernel does to a container (an OOM kill): ``sig`` to each of the pod's
        container process groups. The node agent sees the exit (128 + N) and reports it.
        """
        core = kubernetes.client.CoreV1Api(self.api_client())
        uid = core.read_namespaced_pod(name, namespace).metadata.uid
        hit = []
        for key, pid in self.pids().items():
            if key.startswith(f"pod-{uid[:8]}-") and _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, sig)
                hit.append(key)
        return hit

    def component_pid(self, component: str) -> int:
        return int((self.dir / "pids" / f"{component}.pid").read_text())

    def stop(self) -> None:
        subprocess.run([sys.executable, str(CONTROL_PLANE), "stop", str(self.dir)], check=True)


def start_plane(root: Path) -> ControlPlane:
    """``control-plane start root`` (building on first use: many minutes); fails the test with the
    start log's tail when it does not come up.
    """
    import pytest

    log = root / "start.log"
    root.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        rc = subprocess.run(
            [sys.executable, str(CONTROL_PLANE), "start", str(root)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=3600,
            check=False,
        ).returncode
    if rc != 0:
        pytest.fail(f"control-plane start failed ({rc}):\n{log.read_text()[-6000:]}")
    return ControlPlane(dir=root, kubeconfig=str(root / "kubeconfig"))


@contextlib.contextmanager
def running_plane(root: Path) -> Iterator[ControlPlane]:
    """A plane for the duration of the block: ``$FINETUNE_K8S_PLANE_DIR`` (started by hand, left
    running: a quick loop while writing tests), else a fresh one under ``root``, stopped after.
    """
    if os.environ.get(PLANE_DIR_ENV):
        d = Path(os.environ[PLANE_DIR_ENV]).resolve()
        yield ControlPlane(dir=d, kubeconfig=str(d / "kubeconfig"))
        return
    plane = start_plane(root)
    try:
        yield plane
    finally:
        plane.stop()


def install_namespace(plane: ControlPlane, name: str) -> None:
    """What deploy/README.md installs, in namespace ``name``: deploy/namespace.yaml (its Pod
    Security labels: ``baseline`` enforced, ``restricted`` warned) and deploy/rbac.yaml (the run
    pods' ServiceAccount ``finetune-launcher`` and its Role, the trainer's ``finetune-trainer``).
    Objects already there (a plane started by hand, reused) are left as they are.
    """
    import yaml
    from kubernetes.utils import FailToCreateError, create_from_dict

    client = plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    (ns_doc,) = yaml.safe_load_all((REPO / "deploy" / "namespace.yaml").read_text())
    ns_doc["metadata"]["name"] = name
    try:
        core.create_namespace(ns_doc)
    except kubernetes.client.ApiException as e:
        if e.status != 409:
            raise
    for doc in yaml.safe_load_all((REPO / "deploy" / "rbac.yaml").read_text()):
        doc["metadata"]["namespace"] = name
        for subject in doc.get("subjects", []):
            subject["namespace"] = name
        try:
            create_from_dict(client, doc, namespace=name)
        except FailToCreateError as e:
            if any(getattr(x, "status", None) != 409 for x in e.api_exceptions):
                raise


def wait_until(check, timeout_s: float, what: str, interval_s: float = 0.2):
    """``check()``'s first truthy value; fails naming ``what`` after ``timeout_s`` (a bound on a
    wait, never a timing assertion).
    """
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(interval_s)
    return value


# -- faults from the real components ------------------------------------------------------------


def token_kubeconfig(plane: ControlPlane, path: Path, namespace: str, service_account: str) -> str:
    """A kubeconfig that authenticates as ``namespace/service_account`` with a token from the
    TokenRequest API: what a pod of that ServiceAccount holds, so RBAC (deploy/rbac.yaml) and API
    priority and fairness treat its requests as the run pod's.
    """
    import json

    core = kubernetes.client.CoreV1Api(plane.api_client())
    token = core.create_namespaced_service_account_token(
        service_account, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    admin = json.loads(Path(plane.kubeconfig).read_text())
    user = f"{namespace}-{service_account}"
    admin["users"] = [{"name": user, "user": {"token": token}}]
    admin["contexts"] = [{"name": "local", "context": {"cluster": "local", "user": user}}]
    path.write_text(json.dumps(admin))
    return str(path)


@contextlib.contextmanager
def rejected_by_apf(plane: ControlPlane, namespace: str, service_account: str) -> Iterator[str]:
    """While the block runs, API priority and fairness rejects every request of the
    ServiceAccount: a FlowSchema (precedence 100: before the built-in ones but ``exempt``, which
    keeps the admin's calls going) sends them to a priority level with no seats (nominal
    concurrency shares 0, no borrowing) that rejects what it cannot run: the API server's own 429
    with ``Retry-After``. Yields the FlowSchema's name (its rejections are counted in
    ``apiserver_flowcontrol_rejected_requests_total``).
    """
    client = plane.api_client()
    flow = kubernetes.client.FlowcontrolApiserverV1Api(client)
    name = f"finetune-test-reject-{service_account}"
    flow.create_priority_level_configuration(
        {
            "metadata": {"name": name},
            "spec": {
                "type": "Limited",
                "limited": {
                    "nominalConcurrencyShares": 0,
                    "lendablePercent": 0,
                    "borrowingLimitPercent": 0,
                    "limitResponse": {"type": "Reject"},
                },
            },
        }
    )
    flow.create_flow_schema(
        {
            "metadata": {"name": name},
            "spec": {
                "priorityLevelConfiguration": {"name": name},
                "matchingPrecedence": 100,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [
                            {
                                "kind": "ServiceAccount",
                                "serviceAccount": {"name": service_account, "namespace": namespace},
                            }
                        ],
                        "resourceRules": [
                            {
                                "verbs": ["*"],
                                "apiGroups": ["*"],
                                "resources": ["*"],
                                "namespaces": ["*"],
                                "clusterScope": True,
                            }
                        ],
                        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    }
                ],
            },
        }
    )
    try:
        yield name
    finally:
        flow.delete_flow_schema(name)
        flow.delete_priority_level_configuration(name)


def apf_rejections(plane: ControlPlane, flow_schema: str) -> int:
    """How many requests the API server rejected for ``flow_schema`` (its /metrics)."""
    import re

    text = (
        plane.api_client()
        .call_api("/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False)
        .data.decode()
    )
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_flowcontrol_rejected_requests_total{") and re.search(
            rf'flow_schema="{re.escape(flow_schema)}"', line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
