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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes

REPO = Path(__file__).resolve().parents[4]
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
    Security level relaxed to ``baseline`` enforced, ``restricted`` warned: see below) and
    deploy/rbac.yaml (the run pods' ServiceAccount ``finetune-launcher`` and its Role, the
    trainer's ``finetune-trainer``). Objects already there (a plane started by hand, reused) are
    left as they are.
    """
    import yaml
    from kubernetes.utils import FailToCreateError, create_from_dict

    client = plane.api_client()
    core = kubernetes.client.CoreV1Api(client)
    (ns_doc,) = yaml.safe_load_all((REPO / "deploy" / "namespace.yaml").read_text())
    ns_doc["metadata"]["name"] = name
    # The harness namespace also holds the tests' stand-ins for pods that live elsewhere in a
    # deployment (Dagster's run pods, bare owner pods): "baseline" is enforced here, "restricted"
    # only warned. deploy/namespace.yaml's own "restricted", applied unchanged, is
    # test_restricted_namespace_plane.py's (the launcher's pods pass it).
    labels = ns_doc["metadata"].setdefault("labels", {})
    labels["pod-security.kubernetes.io/enforce"] = "baseline"
    labels["pod-security.kubernetes.io/warn"] = "restricted"
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


# -- the kubelet's faults (node agents) and the API server's audit log ----------------------------


class NodeFaults:
    """The kubelet faults a test asks the plane's node agents for (node_faults.py documents the
    file): a late start, an admission error, an eviction under node pressure, a missing image,
    lagging DNS. :meth:`clear` (the fixture's teardown) leaves the plane without faults.
    """

    def __init__(self, plane: ControlPlane):
        self.path = plane.dir / "node-faults.json"

    def add(self, fault: str, times: int | None = 1, **rule: Any) -> None:
        """A rule (``namespace``, ``labels``, ``seconds``, ``resource``) hitting ``times`` pods."""
        from finetune_assets_tests.core.launchers.k8s import node_faults

        node_faults.edit(
            self.path,
            lambda f: f.setdefault("rules", []).append({"fault": fault, "times": times, **rule}),
        )

    def set(self, **faults: Any) -> None:
        """Plane-wide faults: ``dns_lag_s``, ``missing_images``."""
        from finetune_assets_tests.core.launchers.k8s import node_faults

        node_faults.edit(self.path, lambda f: f.update(faults))

    def left(self, fault: str) -> list[int | None]:
        """The hits each rule of kind ``fault`` has left (0: it happened as often as asked)."""
        import json

        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        return [r.get("times") for r in data.get("rules") or [] if r["fault"] == fault]

    def clear(self) -> None:
        from finetune_assets_tests.core.launchers.k8s import node_faults

        node_faults.edit(self.path, lambda f: f.clear())


def audit_events(plane: ControlPlane, username: str) -> list[dict[str, Any]]:
    """The API server's audit events (``DIR/logs/audit.log``, ResponseComplete stage) of
    ``username``'s requests: ``verb``, ``objectRef`` (``apiGroup``, ``resource``, ``subresource``),
    ``responseStatus``. The plane logs ServiceAccounts only (``.ci/k8s/control-plane``).
    """
    import json

    path = plane.dir / "logs" / "audit.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("user", {}).get("username") == username:
                out.append(event)
    return out


# -- faults from the real components ------------------------------------------------------------


def token_kubeconfig(plane: ControlPlane, path: Path, namespace: str, service_account: str) -> str:
    """A kubeconfig that authenticates as ``namespace/service_account`` with a token from the
    TokenRequest API: what a pod of that ServiceAccount holds, so RBAC (deploy/rbac.yaml) and API
    priority and fairness treat its requests as the run pod's.
    """
    import json

    core = kubernetes.client.CoreV1Api(plane.api_client())
    token = core.create_namespaced_service_account_token(
        service_account, namespace, {"spec": {"expirationSeconds": 4 * 3600}}
    ).status.token
    admin = json.loads(Path(plane.kubeconfig).read_text())
    user = f"{namespace}-{service_account}"
    admin["users"] = [{"name": user, "user": {"token": token}}]
    admin["contexts"] = [{"name": "local", "context": {"cluster": "local", "user": user}}]
    path.write_text(json.dumps(admin))
    return str(path)


@contextlib.contextmanager
def rejected_by_apf(plane: ControlPlane, subjects: list[tuple[str, str]]) -> Iterator[list[str]]:
    """While the block runs, API priority and fairness puts every request of the ServiceAccounts
    (``(namespace, name)``) on one priority level without seats of its own (nominal concurrency
    shares 0, no borrowing) that rejects what it cannot run (``Reject``): one FlowSchema per
    ServiceAccount, precedence 100 (before the built-in ones; ``exempt`` keeps the admin's calls
    going). APF still runs one request of an idle level, so the others are refused only while one
    executes: the API server's own 429 with ``Retry-After``. Yields the FlowSchemas' names, in the
    order of ``subjects`` (their rejections are counted apart, :func:`apf_rejections`).
    """
    client = plane.api_client()
    flow = kubernetes.client.FlowcontrolApiserverV1Api(client)
    level = f"finetune-test-reject-{subjects[0][1]}"
    flow.create_priority_level_configuration(
        {
            "metadata": {"name": level},
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
    names = [f"{level}-{ns}-{sa}" for ns, sa in subjects]
    for name, (ns, sa) in zip(names, subjects, strict=True):
        flow.create_flow_schema(
            {
                "metadata": {"name": name},
                "spec": {
                    "priorityLevelConfiguration": {"name": level},
                    "matchingPrecedence": 100,
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": [
                        {
                            "subjects": [
                                {
                                    "kind": "ServiceAccount",
                                    "serviceAccount": {"name": sa, "namespace": ns},
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
        yield names
    finally:
        for name in names:
            flow.delete_flow_schema(name)
        flow.delete_priority_level_configuration(level)


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


@contextlib.contextmanager
def etcd_down(plane: ControlPlane) -> Iterator[None]:
    """An API outage from the real cause: etcd killed (SIGKILL) for the block, then started again
    on its data (the same command line, its log appended), as a supervisor restarts it. The API
    server keeps running and answers what it cannot read or write with its own errors.
    """
    pid = plane.component_pid("etcd")
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    os.killpg(pid, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.05)
    try:
        yield
    finally:
        log = open(plane.dir / "logs" / "etcd.log", "ab")  # noqa: SIM115 - the process keeps it
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        (plane.dir / "pids" / "etcd.pid").write_text(str(proc.pid))


class AdmissionHooks:
    """A validating admission webhook served by the test (HTTPS with the plane's ``test-webhook``
    certificate), registered with the real API server: what a policy engine in front of a
    cluster's writes does. It plays two troubles for one ServiceAccount's requests:

    - ``fail_deletes``: its next N ``DELETE`` of a Job are refused with 500 (as a webhook that is
      down answers through ``failurePolicy: Fail``);
    - ``hold_s``: every ConfigMap create of the ``hog`` user in namespace ``hog_ns`` is held that
      long (a slow webhook), so that user's requests occupy their priority level's seats.
    """

    def __init__(self, plane: ControlPlane, namespace: str, user: str, hog_ns: str, hog: str):
        self.plane, self.namespace, self.user, self.hog_ns, self.hog = (
            plane,
            namespace,
            user,
            hog_ns,
            hog,
        )
        self.fail_deletes = 0
        self.hold_s = 0.0
        self.refused: list[str] = []  # what it refused (paths of the objects)
        self.seen = 0
        self.name = f"finetune-test-hooks-{namespace}"
        self._lock = threading.Lock()

    def review(self, path: str, review: dict[str, Any]) -> dict[str, Any]:
        req = review["request"]
        user = req.get("userInfo", {}).get("username", "")
        out: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        with self._lock:
            self.seen += 1
            if path == "/fail-deletes" and user == self.user and self.fail_deletes > 0:
                self.fail_deletes -= 1
                self.refused.append(f"{req['namespace']}/{req['name']}")
                out.update(
                    allowed=False,
                    status={"code": 500, "message": "the test's policy webhook is failing"},
                )
        if path == "/hold" and user == self.hog:
            time.sleep(self.hold_s)
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": out}

    def __enter__(self) -> AdmissionHooks:
        import base64
        import json
        import ssl
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                data = json.dumps(hooks.review(self.path.split("?")[0], body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        pki = self.plane.dir / "pki"
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(pki / "test-webhook.crt"), str(pki / "test-webhook.key"))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        url = f"https://127.0.0.1:{self.server.server_address[1]}"
        ca = base64.b64encode((pki / "ca.crt").read_bytes()).decode()

        def hook(name: str, path: str, ns: str, ops: list[str], group: str, res: str) -> dict:
            return {
                "name": f"{name}.finetune.test",
                "clientConfig": {"url": url + path, "caBundle": ca},
                "rules": [
                    {
                        "operations": ops,
                        "apiGroups": [group],
                        "apiVersions": ["v1"],
                        "resources": [res],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 15,
            }

        self.admission = kubernetes.client.AdmissionregistrationV1Api(self.plane.api_client())
        self.admission.create_validating_webhook_configuration(
            {
                "metadata": {"name": self.name},
                "webhooks": [
                    hook(
                        "fail-deletes", "/fail-deletes", self.namespace, ["DELETE"], "batch", "jobs"
                    ),
                    hook("hold", "/hold", self.hog_ns, ["CREATE"], "", "configmaps"),
                ],
            }
        )
        # registered once the API server calls it: a probe create in the hog's namespace
        core = kubernetes.client.CoreV1Api(self.plane.api_client())
        deadline = time.monotonic() + 30
        while self.seen == 0:
            assert time.monotonic() < deadline, "the API server never called the test's webhook"
            core.create_namespaced_config_map(self.hog_ns, {"metadata": {"generateName": "probe-"}})
            time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        self.admission.delete_validating_webhook_configuration(self.name)
        self.server.shutdown()
