"""The Kubernetes API the k8s tests talk to: the loopback test double, or a real cluster.

Default: :class:`KubeApiDouble` on 127.0.0.1 (runs the pods as local processes).
Real cluster: set ``KUBECONFIG`` *and* ``FINETUNE_K8S_TEST_IMAGE`` (an image built from
``deploy/Dockerfile`` that the cluster can pull); optional ``FINETUNE_K8S_TEST_NAMESPACE``
(default ``finetune-test``, must exist) and ``FINETUNE_K8S_TEST_SERVICE_ACCOUNT``. The same tests
run unchanged; the few that need to poke at local processes skip themselves. See deploy/README.md.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from finetune_assets.launchers.k8s import JOB_LABEL, K8sTorchrunLauncher
from finetune_assets_tests.launchers.k8s.apiserver_double import Faults, KubeApiDouble

REPO = Path(__file__).resolve().parents[3]
STANDIN = "finetune_assets_tests.launchers.k8s.standin"
HARNESS_AGENT = "finetune-assets-tests"


@dataclass
class Cluster:
    """What a test needs from "a cluster", the same for the double and a real one."""

    kubeconfig: str | None
    namespace: str
    image: str
    double: KubeApiDouble | None = None
    service_account: str | None = None
    _core: Any = field(default=None, repr=False)
    _batch: Any = field(default=None, repr=False)

    @property
    def is_double(self) -> bool:
        return self.double is not None

    def launcher(self, **overrides: Any) -> K8sTorchrunLauncher:
        fields: dict[str, Any] = dict(
            image=self.image,
            namespace=self.namespace,
            image_pull_policy="IfNotPresent",
            load_incluster_config=False,
            kubeconfig_file=self.kubeconfig,
            trainer_module=STANDIN,
            poll_interval_s=0.5,
            timeout_s=120,
            cpu_request="100m",
            memory_request="256Mi",
            memory_limit="2Gi",
            service_account_name=self.service_account,
        )
        fields.update(overrides)
        return K8sTorchrunLauncher(**fields)

    def _apis(self):
        if self._core is None:
            cfg = kubernetes.client.Configuration()
            kubernetes.config.load_kube_config(
                config_file=self.kubeconfig, client_configuration=cfg
            )
            client = kubernetes.client.ApiClient(cfg)
            client.user_agent = HARNESS_AGENT  # the double tells our own calls from the launcher's
            self._core, self._batch = (
                kubernetes.client.CoreV1Api(client),
                kubernetes.client.BatchV1Api(client),
            )
        return self._core, self._batch

    def create_secret(self, name: str, data: dict[str, str]) -> None:
        core, _ = self._apis()
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
        core.create_namespaced_secret(self.namespace, body)

    def create_pod(self, name: str) -> str:
        """A bare pod standing in for the Dagster run pod that owns a training Job (on the
        double: no process).
        """
        core, _ = self._apis()
        core.create_namespaced_pod(
            self.namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "containers": [
                        {"name": "run", "image": self.image, "command": ["sleep", "3600"]}
                    ]
                },
            },
        )
        return name

    def create_job(self, manifest: dict[str, Any]) -> None:
        _, batch = self._apis()
        batch.create_namespaced_job(self.namespace, manifest)

    def delete_pod(self, name: str) -> None:
        core, _ = self._apis()
        core.delete_namespaced_pod(name, self.namespace)

    def delete_secret(self, name: str) -> None:
        core, _ = self._apis()
        try:
            core.delete_namespaced_secret(name, self.namespace)
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise

    def leftovers(self, job_name: str, wait_s: float = 30.0) -> dict[str, list[str]]:
        """Objects of a launched Job still present after ``wait_s`` (pods go asynchronously)."""
        core, batch = self._apis()
        deadline = time.monotonic() + wait_s
        while True:
            left: dict[str, list[str]] = {}
            for kind, read in (
                ("job", batch.read_namespaced_job),
                ("service", core.read_namespaced_service),
            ):
                try:
                    read(job_name, self.namespace)
                    left.setdefault(kind, []).append(job_name)
                except kubernetes.client.ApiException as e:
                    if e.status != 404:
                        raise
            pods = core.list_namespaced_pod(
                self.namespace, label_selector=f"{JOB_LABEL}={job_name}"
            ).items
            if pods:
                left["pods"] = [p.metadata.name for p in pods]
            if self.double is not None and self.double.live_processes():
                left["processes"] = self.double.live_processes()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


@pytest.fixture(scope="session")
def cluster(request, tmp_path_factory) -> Iterator[Cluster]:
    if os.environ.get("FINETUNE_K8S_CLUSTER") == "plane":
        # the local control plane from upstream (docs/k8s-control-plane.md), as a real cluster
        plane = request.getfixturevalue("control_plane")
        core = kubernetes.client.CoreV1Api(plane.api_client())
        with contextlib.suppress(kubernetes.client.ApiException):
            core.create_namespace(
                {
                    "metadata": {
                        "name": "finetune-test",
                        # as deploy/namespace.yaml
                        "labels": {
                            "pod-security.kubernetes.io/enforce": "baseline",
                            "pod-security.kubernetes.io/warn": "restricted",
                        },
                    }
                }
            )
        yield Cluster(
            kubeconfig=plane.kubeconfig, namespace="finetune-test", image="finetune-assets:test"
        )
        return
    if os.environ.get("KUBECONFIG"):
        image = os.environ.get("FINETUNE_K8S_TEST_IMAGE")
        if not image:
            pytest.skip(
                "KUBECONFIG is set: also set FINETUNE_K8S_TEST_IMAGE to run the k8s tests on "
                "that cluster"
            )
        yield Cluster(
            kubeconfig=os.environ["KUBECONFIG"].split(os.pathsep)[0],
            namespace=os.environ.get("FINETUNE_K8S_TEST_NAMESPACE", "finetune-test"),
            image=image,
            service_account=os.environ.get("FINETUNE_K8S_TEST_SERVICE_ACCOUNT"),
        )
        return
    root = tmp_path_factory.mktemp("kube-double")
    double = KubeApiDouble(workdir=REPO, sandbox=root / "pods").start()
    kubeconfig = double.write_kubeconfig(root / "kubeconfig", namespace="finetune-test")
    try:
        yield Cluster(
            kubeconfig=str(kubeconfig),
            namespace="finetune-test",
            image="finetune-assets:test",
            double=double,
        )
    finally:
        double.stop()


@pytest.fixture
def double(cluster: Cluster) -> KubeApiDouble:
    """For tests that inspect local processes or recorded calls: only on the double."""
    if cluster.double is None:
        pytest.skip("needs the loopback API double")
    return cluster.double


@pytest.fixture
def faults(double: KubeApiDouble) -> Iterator[Faults]:
    """The double's faults for one test; reset afterwards."""
    double.faults = Faults()
    try:
        yield double.faults
    finally:
        double.faults = Faults()


@pytest.fixture
def isolated(double: KubeApiDouble) -> KubeApiDouble:
    """Tests of hostnames, DNS and PID 1 need the double's per-pod namespaces (unshare)."""
    if not double.isolated:
        pytest.skip(
            "needs per-pod UTS/PID/mount namespaces (unshare as root or with user namespaces)"
        )
    return double


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONTROL_PLANE = REPO / ".ci" / "k8s" / "control-plane"


@dataclass
class ControlPlane:
    """The local control plane of ``.ci/k8s/control-plane``: upstream etcd, kube-apiserver,
    kube-controller-manager, kube-scheduler and Kueue, with node agents running pods as processes.
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

    def stop(self) -> None:
        subprocess.run([sys.executable, str(CONTROL_PLANE), "stop", str(self.dir)], check=True)


@pytest.fixture(scope="package")
def control_plane(tmp_path_factory) -> Iterator[ControlPlane]:
    """Starts the real control plane once for the Kubernetes tests (building it on first use:
    minutes), and stops it after them: its idle processes would otherwise share the two cores with
    every later test of the session.

    ``FINETUNE_K8S_PLANE_DIR`` names a plane already started by hand (``control-plane start``):
    used as it is and left running (a quick loop while writing tests).
    """
    if os.environ.get("FINETUNE_K8S_PLANE_DIR"):
        d = Path(os.environ["FINETUNE_K8S_PLANE_DIR"]).resolve()
        yield ControlPlane(dir=d, kubeconfig=str(d / "kubeconfig"))
        return
    root = tmp_path_factory.mktemp("control-plane")
    log = root / "start.log"
    with open(log, "wb") as out:
        rc = subprocess.run(
            [sys.executable, str(CONTROL_PLANE), "start", str(root)],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=3600,
        ).returncode
    if rc != 0:
        pytest.fail(f"control-plane start failed ({rc}):\n{log.read_text()[-6000:]}")
    plane = ControlPlane(dir=root, kubeconfig=str(root / "kubeconfig"))
    try:
        yield plane
    finally:
        plane.stop()
