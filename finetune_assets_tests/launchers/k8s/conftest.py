"""The Kubernetes API the k8s tests talk to: the local control plane, a real cluster, or the
loopback double.

Which one (``FINETUNE_K8S_CLUSTER`` decides when set: ``plane`` or ``double``):

- ``KUBECONFIG`` *and* ``FINETUNE_K8S_TEST_IMAGE`` set: that cluster (an image built from
  ``deploy/Dockerfile`` that the cluster can pull); optional ``FINETUNE_K8S_TEST_NAMESPACE``
  (default ``finetune-test``, must exist) and ``FINETUNE_K8S_TEST_SERVICE_ACCOUNT``. See
  deploy/README.md;
- else the local control plane (``.ci/k8s/control-plane``, docs/k8s-control-plane.md) when its
  binaries for this checkout are built, or in CI (``CI=true``: ``.ci/run`` builds them first);
- else :class:`KubeApiDouble` on 127.0.0.1 (a machine without Go or the build's time).

The same tests run unchanged. Fixtures: ``cluster`` (per test: the tests that ask for the
double's hooks, ``double`` / ``faults`` / ``isolated``, get the double while the rest run on the
plane; on a real cluster they skip), ``k8s_cluster`` (the chosen cluster, package-scoped, for
fixtures of wider scope), ``double_cluster``, ``control_plane``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from finetune_assets.launchers.k8s import JOB_LABEL, K8sTorchrunLauncher
from finetune_assets_tests.launchers.k8s.apiserver_double import Faults, KubeApiDouble
from finetune_assets_tests.launchers.k8s.plane import (  # noqa: F401 - test_control_plane's
    CONTROL_PLANE,
    ControlPlane,
    binaries_built,
    install_namespace,
    running_plane,
    token_kubeconfig,
)

REPO = Path(__file__).resolve().parents[3]
STANDIN = "finetune_assets_tests.launchers.k8s.standin"
HARNESS_AGENT = "finetune-assets-tests"


# What Pod Security "restricted" (deploy/namespace.yaml's level) admits of a container
RESTRICTED_CONTAINER = {
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
}


@dataclass
class Cluster:
    """What a test needs from "a cluster", the same for the double and a real one."""

    kubeconfig: str | None
    namespace: str
    image: str
    double: KubeApiDouble | None = None
    plane: ControlPlane | None = None  # the local control plane, where it is that
    # what the launcher authenticates with (the harness' own calls use ``kubeconfig``): on the
    # plane the run pods' ServiceAccount, so deploy/rbac.yaml's Role is enforced on every launch
    launcher_kubeconfig: str | None = None
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
            kubeconfig_file=self.launcher_kubeconfig or self.kubeconfig,
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
                    # `sleep` as PID 1 ignores SIGTERM: the grace period is how long its deletion
                    # takes (the garbage collector acts once the pod is gone)
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "run",
                            "image": self.image,
                            "command": ["sleep", "3600"],
                            **RESTRICTED_CONTAINER,
                        }
                    ],
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

    @contextlib.contextmanager
    def job_events(self) -> Iterator[list[tuple[str, str, dict[str, str]]]]:
        """``("created" | "deleted", job name, labels)`` of the namespace's Jobs while the block
        runs, in order: a watch on the API server (on the double, its own log). Complete once the
        block has ended (every created Job's deletion waited for, as far as it was deleted).
        """
        out: list[tuple[str, str, dict[str, str]]] = []
        if self.double is not None:
            before = len(self.double.job_log)
            yield out
            out.extend(self.double.job_log[before:])
            return
        from kubernetes import watch

        _, batch = self._apis()
        rv = batch.list_namespaced_job(self.namespace).metadata.resource_version
        stop = threading.Event()

        def follow() -> None:
            nonlocal rv
            while not stop.is_set():
                w = watch.Watch()
                for ev in w.stream(
                    batch.list_namespaced_job,
                    self.namespace,
                    resource_version=rv,
                    timeout_seconds=5,
                ):
                    obj = ev["object"]
                    rv = obj.metadata.resource_version
                    kind = {"ADDED": "created", "DELETED": "deleted"}.get(ev["type"])
                    if kind:
                        out.append((kind, obj.metadata.name, dict(obj.metadata.labels or {})))
                    if stop.is_set():
                        w.stop()

        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        try:
            yield out
        finally:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                created = {n for k, n, _ in out if k == "created"}
                gone = {n for k, n, _ in out if k == "deleted"}
                live = {j.metadata.name for j in batch.list_namespaced_job(self.namespace).items}
                if created - gone <= live:
                    break
                time.sleep(0.2)
            stop.set()
            watcher.join(10)

    def kill_pod(self, name: str, sig: int = signal.SIGKILL) -> None:
        """``sig`` to a pod's processes, as the kernel sends it (an OOM kill): on the local plane
        or the double; a real cluster's nodes are out of reach (the test skips).
        """
        if self.plane is not None:
            assert self.plane.kill_pod(self.namespace, name, sig), f"no live process of {name}"
        elif self.double is not None:
            self.double.kill_pod(name, sig)
        else:
            pytest.skip("killing a pod's processes needs the local plane or the double")

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
            if self.plane is not None and (
                procs := self.plane.live_pod_processes(self.namespace, job_name)
            ):
                left["processes"] = procs
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


def which_cluster() -> str:
    """``plane``, ``kubeconfig`` or ``double``, as the module docstring says."""
    chosen = os.environ.get("FINETUNE_K8S_CLUSTER", "").strip().lower()
    if chosen:
        if chosen not in ("plane", "double"):
            raise pytest.UsageError(f"FINETUNE_K8S_CLUSTER={chosen!r}: expected plane or double")
        return chosen
    if os.environ.get("KUBECONFIG"):
        return "kubeconfig"
    return "plane" if os.environ.get("CI") == "true" or binaries_built() else "double"


@pytest.fixture(scope="package")
def k8s_cluster(request, tmp_path_factory) -> Iterator[Cluster]:
    """The cluster :func:`which_cluster` picks, once for the package (module-scoped fixtures that
    need a cluster take this one).
    """
    kind = which_cluster()
    if kind == "plane":
        # the local control plane from upstream (docs/k8s-control-plane.md), as a real cluster
        plane = request.getfixturevalue("control_plane")
        install_namespace(plane, "finetune-test")  # as deploy/ says
        yield Cluster(
            kubeconfig=plane.kubeconfig,
            namespace="finetune-test",
            image="finetune-assets:test",
            plane=plane,
            launcher_kubeconfig=token_kubeconfig(
                plane,
                tmp_path_factory.mktemp("launcher") / "kubeconfig",
                "finetune-test",
                "finetune-launcher",
            ),
        )
        return
    if kind == "kubeconfig":
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
    yield from _double_cluster(tmp_path_factory)


def _double_cluster(tmp_path_factory) -> Iterator[Cluster]:
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


@pytest.fixture(scope="package")
def double_cluster(tmp_path_factory) -> Iterator[Cluster]:
    """The loopback double, for the tests that use its hooks while the others run on the plane."""
    yield from _double_cluster(tmp_path_factory)


DOUBLE_HOOKS = {"double", "faults", "isolated"}


@pytest.fixture
def cluster(request) -> Cluster:
    """What a test talks to: :func:`k8s_cluster`, except that a test using the double's hooks
    (``double``, ``faults``, ``isolated``: faults no real component makes) gets the loopback double
    while the rest run on the local plane, so CI runs both kinds. On a real cluster those tests
    skip.
    """
    if DOUBLE_HOOKS & set(request.fixturenames) and which_cluster() == "plane":
        return request.getfixturevalue("double_cluster")
    return request.getfixturevalue("k8s_cluster")


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


@pytest.fixture(scope="package")
def control_plane(tmp_path_factory) -> Iterator[ControlPlane]:
    """Starts the real control plane once for the Kubernetes tests (building it on first use:
    minutes), and stops it after them: its idle processes would otherwise share the two cores with
    every later test of the session.

    ``FINETUNE_K8S_PLANE_DIR`` names a plane already started by hand (``control-plane start``):
    used as it is and left running (a quick loop while writing tests).
    """
    with running_plane(tmp_path_factory.mktemp("control-plane")) as plane:
        yield plane
