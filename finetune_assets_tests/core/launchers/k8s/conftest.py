"""The Kubernetes API the k8s tests talk to: the local control plane or a real cluster.

Which one (``FINETUNE_K8S_CLUSTER=plane`` forces the plane):

- ``KUBECONFIG`` *and* ``FINETUNE_K8S_TEST_IMAGE`` set: that cluster (an image built from
  ``deploy/Dockerfile`` that the cluster can pull); optional ``FINETUNE_K8S_TEST_NAMESPACE``
  (default ``finetune-test``, must exist) and ``FINETUNE_K8S_TEST_SERVICE_ACCOUNT``. See
  deploy/README.md;
- else the local control plane (``.ci/k8s/control-plane``, docs/k8s-control-plane.md) when its
  binaries for this checkout are built, or in CI (``CI=true``: ``.ci/run`` builds them first);
- else none: the tests that need a cluster skip, saying how to build the plane.

The same tests run unchanged. Fixtures: ``cluster`` (per test), ``k8s_cluster`` (the chosen
cluster, package-scoped, for fixtures of wider scope), ``control_plane``, ``node_faults`` (the
kubelet faults the plane's node agents play; skips elsewhere).
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

from finetune_assets.core.launchers.k8s import JOB_LABEL
from finetune_assets.defs.resources.k8s_launcher import K8sTorchrunLauncher
from finetune_assets_tests.core.launchers.k8s.plane import (  # noqa: F401 - test_control_plane's
    CONTROL_PLANE,
    ControlPlane,
    NodeFaults,
    binaries_built,
    install_namespace,
    running_plane,
    token_kubeconfig,
)

REPO = Path(__file__).resolve().parents[4]
STANDIN = "finetune_assets_tests.core.launchers.k8s.standin"


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
    """What a test needs from "a cluster", the same for the local plane and a real one."""

    kubeconfig: str | None
    namespace: str
    image: str
    plane: ControlPlane | None = None  # the local control plane, where it is that
    # what the launcher authenticates with (the harness' own calls use ``kubeconfig``): on the
    # plane the run pods' ServiceAccount, so deploy/rbac.yaml's Role is enforced on every launch
    launcher_kubeconfig: str | None = None
    service_account: str | None = None
    _core: Any = field(default=None, repr=False)
    _batch: Any = field(default=None, repr=False)

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
        """A bare pod standing in for the Dagster run pod that owns a training Job."""
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
    def _watching(self, list_fn: Any, on_event: Any, settled: Any) -> Iterator[None]:
        """A watch on ``list_fn`` in the namespace while the block runs, each event passed to
        ``on_event(type, obj)``; at the end, up to 30 s for ``settled(live objects)`` (the
        deletions the watch saw begin, waited for) before the watch stops.
        """
        from kubernetes import watch

        rv = list_fn(self.namespace).metadata.resource_version
        stop = threading.Event()

        def follow() -> None:
            nonlocal rv
            while not stop.is_set():
                w = watch.Watch()
                for ev in w.stream(list_fn, self.namespace, resource_version=rv, timeout_seconds=5):
                    obj = ev["object"]
                    rv = obj.metadata.resource_version
                    on_event(ev["type"], obj)
                    if stop.is_set():
                        w.stop()

        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if settled(list_fn(self.namespace).items):
                    break
                time.sleep(0.2)
            stop.set()
            watcher.join(10)

    @contextlib.contextmanager
    def job_events(self) -> Iterator[list[tuple[str, str, dict[str, str]]]]:
        """``("created" | "deleted", job name, labels)`` of the namespace's Jobs while the block
        runs, in order: a watch on the API server. Complete once the block has ended (every
        created Job's deletion waited for, as far as it was deleted).
        """
        out: list[tuple[str, str, dict[str, str]]] = []

        def on_event(kind: str, obj: Any) -> None:
            name = {"ADDED": "created", "DELETED": "deleted"}.get(kind)
            if name:
                out.append((name, obj.metadata.name, dict(obj.metadata.labels or {})))

        def settled(live: list[Any]) -> bool:
            created = {n for k, n, _ in out if k == "created"}
            gone = {n for k, n, _ in out if k == "deleted"}
            return created - gone <= {j.metadata.name for j in live}

        _, batch = self._apis()
        with self._watching(batch.list_namespaced_job, on_event, settled):
            yield out

    @contextlib.contextmanager
    def pod_history(self) -> Iterator[dict[str, Any]]:
        """The namespace's pods while the block runs, by uid, each as last seen (a watch on the
        API server): how many pods each completion index got and how each ended, also after the
        Job and its pods are gone. Complete once the block has ended (the deletions of the pods
        it saw waited for).
        """
        seen: dict[str, Any] = {}
        gone: set[str] = set()

        def on_event(kind: str, obj: Any) -> None:
            seen[obj.metadata.uid] = obj
            if kind == "DELETED":
                gone.add(obj.metadata.uid)

        core, _ = self._apis()
        with self._watching(
            core.list_namespaced_pod,
            on_event,
            lambda live: set(seen) - gone <= {p.metadata.uid for p in live},
        ):
            yield seen

    def kill_pod(self, name: str, sig: int = signal.SIGKILL) -> None:
        """``sig`` to a pod's processes, as the kernel sends it (an OOM kill): on the local
        plane; a real cluster's nodes are out of reach (the test skips).
        """
        if self.plane is not None:
            assert self.plane.kill_pod(self.namespace, name, sig), f"no live process of {name}"
        else:
            pytest.skip("killing a pod's processes needs the local plane")

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
            if self.plane is not None and (
                procs := self.plane.live_pod_processes(self.namespace, job_name)
            ):
                left["processes"] = procs
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


NO_CLUSTER = (
    "no Kubernetes cluster: build the local control plane once (`.ci/k8s/control-plane build`, "
    "Go 1.26, many minutes; docs/k8s-control-plane.md), or set KUBECONFIG and "
    "FINETUNE_K8S_TEST_IMAGE for a real cluster (deploy/README.md)"
)


def which_cluster() -> str:
    """``plane``, ``kubeconfig`` or ``none``, as the module docstring says."""
    chosen = os.environ.get("FINETUNE_K8S_CLUSTER", "").strip().lower()
    if chosen:
        if chosen != "plane":
            raise pytest.UsageError(
                f"FINETUNE_K8S_CLUSTER={chosen!r}: expected plane (the loopback API double is "
                "gone: its tests run on the local plane)"
            )
        return chosen
    if os.environ.get("KUBECONFIG"):
        return "kubeconfig"
    return "plane" if os.environ.get("CI") == "true" or binaries_built() else "none"


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
    pytest.skip(NO_CLUSTER)


@pytest.fixture
def cluster(k8s_cluster: Cluster) -> Cluster:
    """What a test talks to: :func:`k8s_cluster`."""
    return k8s_cluster


@pytest.fixture
def node_faults(cluster: Cluster) -> Iterator[NodeFaults]:
    """The kubelet faults the plane's node agents play for this test (node_faults.py: a late
    start, an admission error, an eviction under node pressure, a missing image, lagging DNS);
    none afterwards. Only on the local plane: a real cluster's kubelets are out of reach.
    """
    if cluster.plane is None:
        pytest.skip("kubelet faults are played by the local plane's node agents")
    faults = NodeFaults(cluster.plane)
    try:
        yield faults
    finally:
        faults.clear()


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
