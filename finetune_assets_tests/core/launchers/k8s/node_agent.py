"""A node agent for the local control plane: the kubelet's part, with pods as local processes.

Started by ``.ci/k8s/control-plane`` once per node, with the node's own client certificate
(``system:node:<name>``), so the real Node authorizer and NodeRestriction admission decide what
it may read and write. It

- registers its Node (``cpu``, ``memory``, ``pods`` and ``nvidia.com/gpu: 8``: fake devices), keeps
  the ``Ready`` condition fresh and renews its Lease in ``kube-node-lease`` every 5 s, so the
  real node lifecycle controller sees a live node (stop the agent and it sees node loss);
- watches the pods the real scheduler bound to it (``spec.nodeName``) and runs each container's
  ``command + args`` as a local process group with the environment a kubelet gives (``env``,
  ``envFrom``, ``valueFrom`` fieldRef / secretKeyRef / configMapKeyRef, ``$(VAR)`` expansion, the
  ``KUBERNETES_SERVICE_*`` variables), in its own UTS/PID/mount namespace when the host permits
  (:func:`kubelet.isolation_flags`): own hostname, ``/etc/hosts``, ``/dev/shm``;
- gives each pod an address of its own (``10.244.<node>.<n>``, added to ``lo`` when it may, else the
  host's address), which the real EndpointSlice controller publishes;
- answers cluster DNS only from the EndpointSlices the API server holds: every pod's hosts file has
  ``<hostname>.<service>.<ns>.svc(.cluster.local)`` for the ready endpoints of headless Services;
- reports phase, conditions and container statuses (exit codes, 128+N for signal N, ``OOMKilled``
  when a container's memory exceeds its limit: the agent samples RSS and SIGKILLs, as the kernel
  would), honours deletion (SIGTERM to the main process, SIGKILL after the grace period, then the
  final delete with grace 0), and serves ``/containerLogs/{ns}/{pod}/{container}`` over HTTPS (the
  API server's ``pods/log``, ``follow`` included, verified with the cluster CA both ways).

NOT played: images (every container runs this checkout's interpreter: the "image" PATH), restarts
(``restartPolicy`` other than Never runs once), probes, resource isolation other than the memory
limit, networking across hosts (all pods share the host's network namespace and port space), and
ClusterIP Services (no kube-proxy: only headless names resolve).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as _dt
import json
import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes
from kubernetes import watch

from finetune_assets_tests.core.launchers.k8s import node_faults
from finetune_assets_tests.core.launchers.k8s.kubelet import (
    container_env,
    isolation_flags,
    remap,
)

LEASE_S = 40
HEARTBEAT_S = 5.0


def now(micro: bool = False) -> str:
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    return _dt.datetime.now(_dt.timezone.utc).strftime(fmt)


def parse_quantity(text: str) -> float:
    """Bytes of a memory quantity (``2Gi``, ``512M``, ``1e9``)."""
    units = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "K": 1e3,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "m": 1e-3,
    }
    m = re.fullmatch(r"([0-9.eE+-]+)([A-Za-z]*)", str(text))
    if not m:
        raise ValueError(f"bad quantity {text!r}")
    return float(m[1]) * units.get(m[2], 1)


class Container:
    def __init__(self, spec: dict[str, Any], root: Path):
        self.spec = spec
        self.name = spec["name"]
        self.log_path = root / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None
        self.done = threading.Event()
        self.exit_code: int | None = None
        self.oom_killed = False
        self.started_at: str | None = None
        self.finished_at: str | None = None
        self.started_path = root / f"{self.name}.started"
        self.waiting: tuple[str, str] | None = None
        self.depth = 1  # how far below the Popen process (unshare) the command runs

    def main_pid(self) -> int | None:
        """The container's command: the isolating ``unshare``'s child once it has exec'd."""
        if self.proc is None or not self.started_path.exists():
            return None
        pid = self.proc.pid
        for _ in range(self.depth):
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                return None
            if not children:
                return None
            pid = int(children[0])
        return pid


class Pod:
    def __init__(self, obj: dict[str, Any], root: Path):
        self.obj = obj
        self.uid = obj["metadata"]["uid"]
        self.ns = obj["metadata"]["namespace"]
        self.name = obj["metadata"]["name"]
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.containers = [Container(c, root) for c in obj["spec"]["containers"]]
        self.ip: str | None = None
        self.deleting = threading.Event()
        self.finished = threading.Event()
        self.lock = threading.Lock()
        self.hosts_path = root / "hosts"
        self.own_hosts = ""
        self.evicted: str | None = None  # the eviction manager's message, once it evicted the pod


class VolumeNotReady(Exception):
    """A volume's source (ConfigMap, Secret, token) is not there yet: the pod waits."""


class NodeAgent:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.name = args.name
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=args.kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        self.api_host = cfg.host
        self.client = kubernetes.client.ApiClient(cfg)
        self.client.user_agent = f"finetune-node-agent/{self.name}"
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.coord = kubernetes.client.CoordinationV1Api(self.client)
        self.discovery = kubernetes.client.DiscoveryV1Api(self.client)
        self.state = Path(args.state)
        self.state.mkdir(parents=True, exist_ok=True)
        self.pids = Path(args.pids)
        self.addresses = Path(args.addresses)
        self.addresses.mkdir(parents=True, exist_ok=True)
        self.pods: dict[str, Pod] = {}  # uid -> pod
        self.lock = threading.RLock()
        self.dns: dict[str, list[str]] = {}  # name -> ready endpoint addresses, as published
        self.ready_dns: dict[str, list[str]] = {}  # the same, as the EndpointSlices say now
        self.next_ip = 2
        self.isolation = isolation_flags()
        self.stopping = threading.Event()
        self.faults = node_faults.FaultFile(args.faults)
        self.dns_seen: dict[tuple[str, str], float] = {}  # (name, address) -> first seen ready
        self.host_ip = self._host_ip()

    # -- node, lease ------------------------------------------------------------------------------

    @staticmethod
    def _host_ip() -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect(("10.255.255.255", 1))
                return s.getsockname()[0]
            except OSError:
                return "127.0.0.1"

    def node_status(self) -> dict[str, Any]:
        resources = {
            "cpu": self.args.cpu,
            "memory": self.args.memory,
            "pods": "110",
            "ephemeral-storage": "100Gi",
            "nvidia.com/gpu": str(self.args.gpus),
        }
        t = now()
        conds = [
            ("Ready", "True", "KubeletReady", "the local node agent is posting ready status"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "no memory pressure"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "no PID pressure"),
        ]
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": ty,
                    "status": st,
                    "reason": r,
                    "message": m,
                    "lastHeartbeatTime": t,
                    "lastTransitionTime": self.started,
                }
                for ty, st, r, m in conds
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "nodeInfo": {
                "machineID": self.name,
                "systemUUID": self.name,
                "bootID": self.started,
                "kernelVersion": os.uname().release,
                "osImage": "local processes",
                "containerRuntimeVersion": "local://0",
                "kubeletVersion": "v0.0.0-local",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def register(self) -> None:
        self.started = now()
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": "local-process",
                },
            },
        }
        try:
            self.core.create_node(body)
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
        self.core.patch_node_status(self.name, {"status": self.node_status()})

    def heartbeat(self) -> None:
        lease_name, ns = self.name, "kube-node-lease"
        while not self.stopping.wait(HEARTBEAT_S):
            try:
                self.core.patch_node_status(self.name, {"status": self.node_status()})
                self.renew_lease(lease_name, ns)
            except Exception as e:  # an API outage: keep trying, as the kubelet does
                print(f"heartbeat failed: {e}", file=sys.stderr, flush=True)

    def renew_lease(self, name: str, ns: str) -> None:
        spec = {
            "holderIdentity": self.name,
            "leaseDurationSeconds": LEASE_S,
            "renewTime": now(micro=True),
        }
        try:
            self.coord.patch_namespaced_lease(name, ns, {"spec": spec})
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise
            node = self.core.read_node(self.name)
            self.coord.create_namespaced_lease(
                ns,
                {
                    "metadata": {
                        "name": name,
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Node",
                                "name": self.name,
                                "uid": node.metadata.uid,
                            }
                        ],
                    },
                    "spec": spec,
                },
            )

    # -- watches ----------------------------------------------------------------------------------

    def watch_pods(self) -> None:
        selector = f"spec.nodeName={self.name}"
        rv = None
        while not self.stopping.is_set():
            try:
                if rv is None:
                    listed = self.client.sanitize_for_serialization(
                        self.core.list_pod_for_all_namespaces(field_selector=selector)
                    )
                    for obj in listed["items"]:
                        self.on_pod(obj)
                    rv = listed["metadata"]["resourceVersion"]
                for ev in watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=rv,
                    timeout_seconds=60,
                    _preload_content=False,
                ):
                    obj = ev["raw_object"]
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] == "DELETED":
                        self.on_pod_gone(obj["metadata"]["uid"])
                    else:
                        self.on_pod(obj)
            except Exception as e:  # an API outage or a broken watch: list again
                print(f"pod watch: {e}", file=sys.stderr, flush=True)
                rv = None
                time.sleep(1)

    def watch_endpoints(self) -> None:
        rv = None
        slices: dict[str, dict[str, Any]] = {}
        while not self.stopping.is_set():
            try:
                if rv is None:
                    listed = self.client.sanitize_for_serialization(
                        self.discovery.list_endpoint_slice_for_all_namespaces()
                    )
                    slices = {s["metadata"]["uid"]: s for s in listed["items"]}
                    rv = listed["metadata"]["resourceVersion"]
                    self.publish_dns(slices)
                for ev in watch.Watch().stream(
                    self.discovery.list_endpoint_slice_for_all_namespaces,
                    resource_version=rv,
                    timeout_seconds=60,
                    _preload_content=False,
                ):
                    obj = ev["raw_object"]
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] == "DELETED":
                        slices.pop(obj["metadata"]["uid"], None)
                    else:
                        slices[obj["metadata"]["uid"]] = obj
                    self.publish_dns(slices)
            except Exception as e:
                print(f"endpointslice watch: {e}", file=sys.stderr, flush=True)
                rv = None
                time.sleep(1)

    def publish_dns(self, slices: dict[str, dict[str, Any]]) -> None:
        """What CoreDNS answers for headless Services: ``<hostname>.<svc>.<ns>.svc`` per ready
        endpoint with a hostname, and ``<svc>.<ns>.svc`` for all of them.
        """
        dns: dict[str, list[str]] = {}
        for s in slices.values():
            labels = s["metadata"].get("labels") or {}
            svc = labels.get("kubernetes.io/service-name")
            if not svc or "service.kubernetes.io/headless" not in labels:
                continue
            ns = s["metadata"]["namespace"]
            for ep in s.get("endpoints") or []:
                if not (ep.get("conditions") or {}).get("ready", False):
                    continue
                for addr in ep.get("addresses") or []:
                    dns.setdefault(f"{svc}.{ns}.svc", []).append(addr)
                    if ep.get("hostname"):
                        dns.setdefault(f"{ep['hostname']}.{svc}.{ns}.svc", []).append(addr)
        with self.lock:
            self.ready_dns = dns
        self.refresh_dns()

    def refresh_dns(self) -> None:
        """Publishes the ready names into every pod's hosts file, each only ``dns_lag_s`` (the
        fault file's) after its endpoint became ready: a busy cluster's EndpointSlice propagation
        and CoreDNS cache, during which a peer's name does not resolve yet.
        """
        lag = float(self.faults.read().get("dns_lag_s") or 0.0)
        t = time.monotonic()
        dns: dict[str, list[str]] = {}
        pending = []
        with self.lock:
            keys = [(n, a) for n, addrs in self.ready_dns.items() for a in addrs]
            self.dns_seen = {k: self.dns_seen.get(k, t) for k in keys}
            for (name, addr), since in self.dns_seen.items():
                if t - since >= lag:
                    dns.setdefault(name, []).append(addr)
                else:
                    pending.append(since + lag - t)
            self.dns = dns
            pods = list(self.pods.values())
        if pending:
            timer = threading.Timer(min(pending) + 0.05, self.refresh_dns)
            timer.daemon = True
            timer.start()
        for pod in pods:
            self.write_hosts(pod)

    def hosts_lines(self) -> str:
        with self.lock:
            return "".join(
                f"{ip}\t{name}.cluster.local {name}\n"
                for name, ips in sorted(self.dns.items())
                for ip in ips
            )

    def write_hosts(self, pod: Pod) -> None:
        if not pod.own_hosts:
            return
        with pod.lock, contextlib.suppress(FileNotFoundError):
            if not pod.hosts_path.exists():
                pod.hosts_path.write_text(pod.own_hosts + self.hosts_lines())
                return
            with open(pod.hosts_path, "r+") as f:  # in place: the bind mount follows the inode
                f.truncate(0)
                f.write(pod.own_hosts + self.hosts_lines())

    # -- pods -------------------------------------------------------------------------------------

    def on_pod(self, obj: dict[str, Any]) -> None:
        uid = obj["metadata"]["uid"]
        with self.lock:
            pod = self.pods.get(uid)
            if pod is None:
                if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    return  # ran before this agent started
                pod = Pod(obj, self.state / "pods" / uid)
                self.pods[uid] = pod
                threading.Thread(
                    target=self.run_pod, args=(pod,), daemon=True, name=f"pod-{pod.name}"
                ).start()
            pod.obj = obj
        if obj["metadata"].get("deletionTimestamp") and not pod.deleting.is_set():
            grace = obj["metadata"].get("deletionGracePeriodSeconds")
            pod.deleting.set()
            threading.Thread(
                target=self.delete_pod, args=(pod, 30 if grace is None else grace), daemon=True
            ).start()

    def on_pod_gone(self, uid: str) -> None:
        with self.lock:
            pod = self.pods.pop(uid, None)
        if pod is not None:
            pod.deleting.set()
            self.kill(pod, 0)
            self.release_ip(pod)

    def delete_pod(self, pod: Pod, grace: float) -> None:
        self.kill(pod, grace)
        pod.finished.wait(30)
        with contextlib.suppress(kubernetes.client.ApiException):
            self.core.delete_namespaced_pod(
                pod.name,
                pod.ns,
                grace_period_seconds=0,
                body={"preconditions": {"uid": pod.uid}, "gracePeriodSeconds": 0},
            )

    def kill(self, pod: Pod, grace: float) -> None:
        """The kubelet's way: SIGTERM to each main process, SIGKILL to the groups after grace."""
        live = [c for c in pod.containers if c.proc is not None and c.proc.poll() is None]
        for c in live:
            main = c.main_pid()
            with contextlib.suppress(ProcessLookupError):
                if main is not None and grace > 0:
                    os.kill(main, signal.SIGTERM)
                else:
                    os.killpg(c.proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace
        for c in live:
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.proc.pid, signal.SIGKILL)
        for c in pod.containers:
            if c.proc is None:
                c.done.set()

    def allocate_ip(self, pod: Pod) -> str:
        with self.lock:
            n = self.next_ip
            self.next_ip = 2 + (self.next_ip - 1) % 250
        ip = f"{self.args.pod_subnet}.{n}"
        r = subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], capture_output=True)
        if r.returncode != 0 and b"exists" not in r.stderr:
            return self.host_ip  # no CAP_NET_ADMIN: every pod shares the host's address
        (self.addresses / ip).write_text(pod.uid)
        return ip

    def release_ip(self, pod: Pod) -> None:
        ip = pod.ip
        if ip and (self.addresses / ip).exists():
            subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], capture_output=True)
            (self.addresses / ip).unlink(missing_ok=True)

    def patch_status(self, pod: Pod, status: dict[str, Any]) -> None:
        for attempt in range(30):
            try:
                self.core.patch_namespaced_pod_status(pod.name, pod.ns, {"status": status})
                return
            except kubernetes.client.ApiException as e:
                if e.status == 404:
                    return
                print(f"status of {pod.name}: {e.status} {e.reason}", file=sys.stderr)
            except Exception as e:  # API outage: retry
                print(f"status of {pod.name}: {e}", file=sys.stderr)
            time.sleep(min(0.2 * 2**attempt, 5))

    def container_statuses(self, pod: Pod) -> list[dict[str, Any]]:
        out = []
        for c in pod.containers:
            st: dict[str, Any] = {
                "name": c.name,
                "image": c.spec.get("image", ""),
                "imageID": "",
                "restartCount": 0,
            }
            if c.exit_code is not None:
                reason = (
                    "Completed" if c.exit_code == 0 else ("OOMKilled" if c.oom_killed else "Error")
                )
                st.update(
                    ready=False,
                    started=False,
                    state={
                        "terminated": {
                            "exitCode": c.exit_code,
                            "reason": reason,
                            "startedAt": c.started_at,
                            "finishedAt": c.finished_at,
                            "containerID": f"local://{c.proc.pid}",
                        }
                    },
                    containerID=f"local://{c.proc.pid}",
                )
            elif c.proc is not None:
                st.update(
                    ready=True,
                    started=True,
                    state={"running": {"startedAt": c.started_at}},
                    containerID=f"local://{c.proc.pid}",
                )
            else:
                reason, msg = c.waiting or ("ContainerCreating", "")
                st.update(
                    ready=False,
                    started=False,
                    state={"waiting": {"reason": reason, "message": msg}},
                )
            out.append(st)
        return out

    def conditions(self, ready: bool, reason: str | None = None) -> list[dict[str, Any]]:
        t = now()
        out = []
        for ty in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady"):
            ok = ready or ty in ("Initialized", "PodReadyToStartContainers")
            c = {"type": ty, "status": "True" if ok else "False", "lastTransitionTime": t}
            if not ok and reason:
                c["reason"] = reason
            out.append(c)
        return out

    def run_pod(self, pod: Pod) -> None:
        try:
            self._run_pod(pod)
        except Exception as e:
            print(f"pod {pod.ns}/{pod.name}: {e!r}", file=sys.stderr, flush=True)
            raise
        finally:
            pod.finished.set()

    def _run_pod(self, pod: Pod) -> None:
        if not self.admit(pod):
            return
        rule = self.faults.take("start_delay", pod.obj)
        if rule is not None:  # a slow sandbox or image pull: Pending, ContainerCreating
            for c in pod.containers:
                c.waiting = ("ContainerCreating", "")
            self.patch_status(
                pod, {"phase": "Pending", "containerStatuses": self.container_statuses(pod)}
            )
            if pod.deleting.wait(float(rule.get("seconds", 0.0))):
                return
        # env first: a missing Secret keeps the pod waiting (CreateContainerConfigError), retried
        while True:
            if pod.deleting.is_set():
                return
            try:
                self.prepare_volumes(pod)
            except VolumeNotReady as e:  # the kubelet's FailedMount: ContainerCreating, retried
                for c in pod.containers:
                    c.waiting = ("ContainerCreating", str(e))
                self.patch_status(
                    pod, {"phase": "Pending", "containerStatuses": self.container_statuses(pod)}
                )
                time.sleep(2)
                continue
            try:
                prepared = [self.container_process(pod, c.spec) for c in pod.containers]
                break
            except ValueError as e:
                for c in pod.containers:
                    c.waiting = ("CreateContainerConfigError", str(e))
                self.patch_status(
                    pod, {"phase": "Pending", "containerStatuses": self.container_statuses(pod)}
                )
                time.sleep(2)
        if not self.pull_images(pod):
            return
        pod.ip = self.allocate_ip(pod)
        spec = pod.obj["spec"]
        hostname = spec.get("hostname") or pod.name
        fqdn = (
            f"{hostname}.{spec['subdomain']}.{pod.ns}.svc.cluster.local {hostname}"
            if spec.get("subdomain")
            else hostname
        )
        pod.own_hosts = f"127.0.0.1\tlocalhost\n{pod.ip}\t{fqdn}\n"
        self.write_hosts(pod)
        (pod.root / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files\n")
        started = now()
        with pod.lock:
            if pod.deleting.is_set():
                return
            for c, (argv, env) in zip(pod.containers, prepared):
                if pod.deleting.is_set():
                    break
                c.started_at = now()
                with open(c.log_path, "wb") as out:
                    try:
                        c.proc = subprocess.Popen(
                            self.isolate(pod, c, hostname, argv, env),
                            env=env,
                            cwd=self.args.workdir,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True,
                        )
                    except OSError as e:  # like a runtime StartError
                        out.write(f"failed to start {argv[:1]}: {e}\n".encode())
                        c.proc = subprocess.Popen(["false"], stdout=out, start_new_session=True)
                (self.pids / pid_file_name(pod, c)).write_text(str(c.proc.pid))
        self.patch_status(
            pod,
            {
                "phase": "Running",
                "podIP": pod.ip,
                "podIPs": [{"ip": pod.ip}],
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "startTime": started,
                "conditions": self.conditions(True),
                "containerStatuses": self.container_statuses(pod),
            },
        )
        waiters = [
            threading.Thread(target=self.wait_container, args=(pod, c), daemon=True)
            for c in pod.containers
            if c.proc is not None
        ]
        for w in waiters:
            w.start()
        for w in waiters:
            w.join()
        failed = any(c.exit_code != 0 for c in pod.containers)
        self.release_ip(pod)
        status = {
            "phase": "Failed" if failed else "Succeeded",
            "conditions": self.conditions(False, "PodCompleted"),
            "containerStatuses": self.container_statuses(pod),
        }
        if pod.evicted is not None:  # eviction_manager.go evictPod's status
            status.update(phase="Failed", reason=node_faults.EVICTION_REASON, message=pod.evicted)
            status["conditions"].append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": node_faults.EVICTION_CONDITION_REASON,
                    "message": pod.evicted,
                    "lastTransitionTime": now(),
                }
            )
        self.patch_status(pod, status)

    # -- kubelet faults (node_faults.py: what the test's fault file asks for) ---------------------

    def event(self, pod: Pod, reason: str, message: str, warning: bool = True) -> None:
        """An Event about the pod, as the kubelet records one (source: kubelet on this node)."""
        t = now()
        body = {
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.ns},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": pod.ns,
                "name": pod.name,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": "kubelet", "host": self.name},
            "reportingComponent": "kubelet",
            "reportingInstance": self.name,
            "firstTimestamp": t,
            "lastTimestamp": t,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(pod.ns, body)
        except Exception as e:  # an Event is a diagnosis; the status says what happened
            print(f"event {reason} of {pod.name}: {e}", file=sys.stderr, flush=True)

    def admit(self, pod: Pod) -> bool:
        """Kubelet admission: an ``admission_error`` rule rejects the pod as the device manager
        does after its plugin restarted (kubelet.go ``rejectPod``: Failed, never started).
        """
        if self.faults.take("admission_error", pod.obj) is None:
            return True
        reason, message = node_faults.ADMISSION_REASON, node_faults.ADMISSION_MESSAGE
        self.event(pod, reason, message)
        self.patch_status(
            pod, {"phase": "Failed", "reason": reason, "message": "Pod was rejected: " + message}
        )
        return False

    def pull_images(self, pod: Pod) -> bool:
        """The registry lacks the fault file's ``missing_images``: ``ErrImagePull``, then
        ``ImagePullBackOff`` with the kubelet's back-off (10 s, doubling), retried until the pod is
        deleted, with image_manager.go's Events and messages. False: the pod never starts.
        """
        missing = set(self.faults.read().get("missing_images") or [])
        bad = [c for c in pod.containers if c.spec.get("image") in missing]
        backoff = 10.0
        while bad:
            for c in bad:
                image, err = c.spec["image"], node_faults.pull_error(c.spec["image"])
                self.event(pod, "Pulling", f'Pulling image "{image}"', warning=False)
                self.event(pod, "Failed", f'Failed to pull image "{image}": {err}')
                self.event(pod, "Failed", "Error: ErrImagePull")
                c.waiting = ("ErrImagePull", err)
            self.patch_status(
                pod, {"phase": "Pending", "containerStatuses": self.container_statuses(pod)}
            )
            if pod.deleting.wait(backoff):
                return False
            for c in bad:
                image, err = c.spec["image"], node_faults.pull_error(c.spec["image"])
                self.event(pod, "BackOff", f'Back-off pulling image "{image}"', warning=False)
                self.event(pod, "Failed", "Error: ImagePullBackOff")
                c.waiting = (
                    "ImagePullBackOff",
                    f'Back-off pulling image "{image}": ErrImagePull: {err}',
                )
            self.patch_status(
                pod, {"phase": "Pending", "containerStatuses": self.container_statuses(pod)}
            )
            if pod.deleting.wait(backoff):
                return False
            backoff = min(backoff * 2, 300.0)
        return True

    def eviction_manager(self) -> None:
        """The kubelet's eviction manager: while the fault file has an ``evict`` rule, it
        evicts a running pod that the rule matches (at most one per pass, as the kubelet does).
        """
        while not self.stopping.wait(0.5):
            rules = [
                r
                for r in self.faults.read().get("rules") or []
                if r.get("fault") == "evict" and r.get("times") != 0
            ]
            if not rules:
                continue
            with self.lock:
                running = [
                    p
                    for p in self.pods.values()
                    if not p.deleting.is_set()
                    and p.evicted is None
                    and any(c.main_pid() is not None and c.exit_code is None for c in p.containers)
                ]
            for pod in running:
                rule = self.faults.take("evict", pod.obj)
                if rule is not None:
                    self.evict(pod, rule.get("resource") or "memory")
                    break

    def evict(self, pod: Pod, resource: str) -> None:
        """eviction_manager.go ``evictPod`` for a hard threshold: an ``Evicted`` Event, the
        containers killed with a 1 s grace period, the pod Failed / ``Evicted`` with the
        ``DisruptionTarget`` condition (``TerminationByKubelet``) written at the end of the run.
        """
        c = pod.containers[0]
        request = ((c.spec.get("resources") or {}).get("requests") or {}).get(resource, "0")
        pod.evicted = node_faults.eviction_message(resource, c.name, request)
        self.event(pod, node_faults.EVICTION_REASON, pod.evicted)
        threading.Thread(
            target=self.kill, args=(pod, node_faults.EVICTION_GRACE_S), daemon=True
        ).start()

    def wait_container(self, pod: Pod, c: Container) -> None:
        limit = ((c.spec.get("resources") or {}).get("limits") or {}).get("memory")
        limit_b = parse_quantity(limit) if limit else None
        while True:
            try:
                rc = c.proc.wait(0.5)
                break
            except subprocess.TimeoutExpired:
                if limit_b is not None and rss_of_group(c.proc.pid) > limit_b:
                    c.oom_killed = True  # the kernel's OOM killer at the cgroup limit
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(c.proc.pid, signal.SIGKILL)
        c.exit_code = 128 - rc if rc < 0 else rc  # killed by signal N -> 128 + N
        c.finished_at = now()
        c.done.set()
        (self.pids / pid_file_name(pod, c)).unlink(missing_ok=True)

    def container_process(self, pod: Pod, c: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        host, _, port = self.api_host.removeprefix("https://").rpartition(":")
        base = {
            "HOSTNAME": pod.obj["spec"].get("hostname") or pod.name,
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
        }
        argv, env = container_env(
            c,
            pod.obj["metadata"],
            base,
            self.fields(pod),
            lambda kind, name: self.read_object(pod.ns, kind, name),
        )
        mounts = {
            m["mountPath"]: pod.root / "volumes" / m["name"]
            for m in c.get("volumeMounts", [])
            if m["mountPath"] != "/dev/shm"
            and any(
                v["name"] == m["name"] and "emptyDir" in v
                for v in pod.obj["spec"].get("volumes", [])
            )
        }
        for path in mounts.values():
            path.mkdir(parents=True, exist_ok=True)
        # emptyDir mounts: env values under them point into the pod's folder (kubelet.remap)
        env = {k: v if k == "PATH" else remap(v, mounts) for k, v in env.items()}
        return argv, env

    def fields(self, pod: Pod) -> dict[str, str]:
        """What ``fieldRef`` reads besides labels and annotations."""
        return {
            "metadata.name": pod.name,
            "metadata.namespace": pod.ns,
            "metadata.uid": pod.uid,
            "spec.nodeName": self.name,
            "spec.serviceAccountName": pod.obj["spec"].get("serviceAccountName", ""),
            "status.podIP": pod.ip or "",
            "status.hostIP": "127.0.0.1",
        }

    def read_object(self, ns: str, kind: str, name: str) -> dict[str, str] | None:
        """A Secret's or ConfigMap's data as the node may read it (None: not found).

        A 403 right after the pod was bound is the Node authorizer's graph not yet knowing that
        this node's pod references the object (seen on the loaded CI machine): retried for 30 s,
        as the kubelet's sync loop retries a pod whose Secret it cannot read yet.
        """
        deadline = time.monotonic() + 30
        while True:
            try:
                if kind == "secret":
                    obj = self.core.read_namespaced_secret(name, ns)
                    return {k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()}
                return dict(self.core.read_namespaced_config_map(name, ns).data or {})
            except kubernetes.client.ApiException as e:
                if e.status == 404:
                    return None
                if e.status != 403 or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def isolate(
        self, pod: Pod, c: Container, hostname: str, argv: list[str], env: dict[str, str]
    ) -> list[str]:
        """Own hostname, PID 1, /dev/shm and /etc/hosts for the container (unshare)."""
        if self.isolation is None:
            c.started_path.touch()
            return argv
        q = shlex.quote
        setup = (
            f"hostname {q(hostname)} && mount --bind {q(str(pod.hosts_path))} /etc/hosts && "
            f"mount --bind {q(str(pod.root / 'nsswitch.conf'))} /etc/nsswitch.conf && "
            "mount -t tmpfs -o size=1g tmpfs /dev/shm"
        )
        for src, dst, ro in self.volume_mounts(pod, c):
            # the mount point is made on the host once (an empty folder or file), bound privately;
            # a host that refuses (no root: a user namespace) runs the container without it
            point = (
                f"mkdir -p {q(dst)}"
                if src.is_dir()
                else f"mkdir -p {q(str(Path(dst).parent))} && touch {q(dst)}"
            )
            bind = f"{{ [ -e {q(dst)} ] || {point}; }} && mount --bind {q(str(src))} {q(dst)}"
            if ro:
                bind += f" && mount -o remount,bind,ro {q(dst)}"
            setup += f" && {{ {bind} || echo {q(f'node agent: cannot mount {dst}')} >&2; }}"
        started = f": > {q(str(c.started_path))}"
        if pod.obj["spec"].get("shareProcessNamespace"):
            # the pause container is PID 1 and reaps: the command is not PID 1, so it can be
            # signalled from inside the pod
            c.depth, run = 2, '"$0" "$@" & wait $!'
        else:
            c.depth, run = 1, 'exec "$0" "$@"'  # PID 1 of its namespace
        return [*self.isolation, "sh", "-c", f"{setup} && {started} && {run}", *argv]

    # -- volumes ----------------------------------------------------------------------------------

    def prepare_volumes(self, pod: Pod) -> None:
        """Writes each ``configMap``, ``secret``, ``downwardAPI`` and ``projected`` volume into
        ``<pod>/volumes/<name>/`` as the kubelet does, the ServiceAccount admission's
        ``kube-api-access-*`` volume included: a token from the TokenRequest API bound to this pod
        (the Node authorizer lets a node ask only for pods bound to it), ``ca.crt`` from the
        ``kube-root-ca.crt`` ConfigMap, ``namespace``. :meth:`isolate` binds them at their
        ``mountPath`` (``/var/run/secrets/kubernetes.io/serviceaccount``: in-cluster config works).
        Raises :class:`VolumeNotReady` while a source a volume needs is missing.
        """
        for vol in pod.obj["spec"].get("volumes") or []:
            files: dict[str, bytes] = {}
            if "configMap" in vol or "secret" in vol:
                files = self.object_files(pod, vol)
            elif "downwardAPI" in vol:
                files = self.downward_files(pod, vol["downwardAPI"].get("items") or [])
            elif "projected" in vol:
                for src in vol["projected"].get("sources") or []:
                    if "serviceAccountToken" in src:
                        tok = src["serviceAccountToken"]
                        files[tok["path"]] = self.token(pod, tok).encode()
                    elif "downwardAPI" in src:
                        files.update(
                            self.downward_files(pod, src["downwardAPI"].get("items") or [])
                        )
                    else:
                        files.update(self.object_files(pod, src))
            else:
                continue  # emptyDir: made per mount (container_process); others: not played
            root = pod.root / "volumes" / vol["name"]
            root.mkdir(parents=True, exist_ok=True)
            for rel, data in files.items():
                path = root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_bytes(data)
                tmp.replace(path)  # atomic, as the kubelet's atomic writer swaps its files

    def object_files(self, pod: Pod, src: dict[str, Any]) -> dict[str, bytes]:
        kind = "secret" if "secret" in src else "configmap"
        ref = src.get("secret") or src.get("configMap") or {}
        name = ref.get("secretName") or ref.get("name")
        try:
            if kind == "secret":
                obj = self.core.read_namespaced_secret(name, pod.ns)
                data = {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
            else:
                obj = self.core.read_namespaced_config_map(name, pod.ns)
                data = {k: v.encode() for k, v in (obj.data or {}).items()}
                data.update({k: base64.b64decode(v) for k, v in (obj.binary_data or {}).items()})
        except kubernetes.client.ApiException as e:
            if e.status == 404 and ref.get("optional"):
                return {}
            raise VolumeNotReady(f'{kind} "{name}" not found') from e
        items = ref.get("items")
        if not items:
            return data
        out = {}
        for it in items:
            if it["key"] not in data:
                if ref.get("optional"):
                    continue
                raise VolumeNotReady(f'{kind} "{name}" has no key "{it["key"]}"')
            out[it["path"]] = data[it["key"]]
        return out

    def downward_files(self, pod: Pod, items: list[dict[str, Any]]) -> dict[str, bytes]:
        out = {}
        for it in items:
            if "fieldRef" in it:
                path = it["fieldRef"]["fieldPath"]
                meta = pod.obj["metadata"]
                m = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
                value = (meta.get(m[1]) or {}).get(m[2], "") if m else self.fields(pod)[path]
                out[it["path"]] = value.encode()
        return out

    def token(self, pod: Pod, src: dict[str, Any]) -> str:
        sa = pod.obj["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {
            "expirationSeconds": src.get("expirationSeconds", 3607),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid},
        }
        if src.get("audience"):
            spec["audiences"] = [src["audience"]]
        try:
            got = self.core.create_namespaced_service_account_token(sa, pod.ns, {"spec": spec})
        except kubernetes.client.ApiException as e:
            raise VolumeNotReady(f'token for serviceaccount "{sa}": {e.status} {e.reason}') from e
        return got.status.token

    def volume_mounts(self, pod: Pod, c: Container) -> list[tuple[Path, str, bool]]:
        """``(source, mountPath, readOnly)`` of the container's mounts of prepared volumes."""
        prepared = {
            v["name"]
            for v in pod.obj["spec"].get("volumes") or []
            if {"configMap", "secret", "downwardAPI", "projected"} & v.keys()
        }
        out = []
        for m in c.spec.get("volumeMounts") or []:
            if m["name"] in prepared:
                src = pod.root / "volumes" / m["name"] / (m.get("subPath") or "")
                out.append((src, m["mountPath"], bool(m.get("readOnly"))))
        return out

    # -- logs -------------------------------------------------------------------------------------

    def container_for_logs(self, ns: str, name: str, container: str) -> Container | None:
        with self.lock:
            pods = [p for p in self.pods.values() if p.ns == ns and p.name == name]
        for p in pods:
            for c in p.containers:
                if c.name == container:
                    return c
        return None

    def serve(self) -> ThreadingHTTPServer:
        agent = self

        class Handler(LogHandler):
            pass

        Handler.agent = agent
        server = ThreadingHTTPServer(("127.0.0.1", self.args.port), Handler)
        server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.args.cert, self.args.key)
        ctx.load_verify_locations(self.args.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED  # only the API server's kubelet-client certificate
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True, name="kubelet-api").start()
        return server

    # -- main -------------------------------------------------------------------------------------

    def run(self) -> None:
        self.port = self.args.port
        self.serve()
        self.register()
        self.renew_lease(self.name, "kube-node-lease")
        for target in (
            self.heartbeat,
            self.watch_pods,
            self.watch_endpoints,
            self.eviction_manager,
        ):
            threading.Thread(target=target, daemon=True, name=target.__name__).start()
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        print(f"node agent {self.name} ready on :{self.port}", flush=True)
        while not self.stopping.wait(1):
            pass
        # the node goes away: its processes die with it, nothing more is reported
        with self.lock:
            pods = list(self.pods.values())
        for pod in pods:
            self.kill(pod, 0)
            self.release_ip(pod)


def pid_file_name(pod: Pod, c: Container) -> str:
    """``pod-<uid8>-<ns>_<pod>_<container>.pid`` (``_`` is in no Kubernetes name): the plane's
    ``stop`` kills what is left, the tests find a pod's processes by name or uid.
    """
    return f"pod-{pod.uid[:8]}-{pod.ns}_{pod.name}_{c.name}.pid"


def rss_of_group(pgid: int) -> float:
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5: pgrp
            total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss pages
    return total


class LogHandler(BaseHTTPRequestHandler):
    """``GET /containerLogs/{ns}/{pod}/{container}``: what the API server's pods/log proxies to."""

    agent: NodeAgent
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            self.send_error(404)
            return
        c = self.agent.container_for_logs(parts[1], parts[2], parts[3])
        if c is None or not c.log_path.exists():
            self.send_error(404, f"container {parts[3]} of pod {parts[1]}/{parts[2]} not found")
            return
        query = parse_qs(url.query)
        follow = query.get("follow", ["false"])[0].lower() in ("true", "1")
        tail = query.get("tailLines", [None])[0]
        limit = query.get("limitBytes", [None])[0]
        data = c.log_path.read_bytes()
        if tail is not None:
            data = b"".join(data.splitlines(keepends=True)[-int(tail) :] if int(tail) else [])
        if not follow:
            if limit is not None:
                data = data[: int(limit)]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            with open(c.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                end = f.tell()
                if data:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                f.seek(end)
                while True:
                    done = c.done.is_set()
                    chunk = f.read(65536)
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    elif done:
                        break
                    else:
                        time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        self.close_connection = True


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--client-ca", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--pids", required=True)
    p.add_argument("--addresses", required=True)
    p.add_argument("--pod-subnet", required=True, help="first three octets, e.g. 10.244.1")
    p.add_argument("--workdir", required=True)
    p.add_argument("--cpu", default="32")
    p.add_argument("--memory", default="256Gi")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--faults", default=None, help="the plane's fault file (node_faults.py)")
    NodeAgent(p.parse_args(argv)).run()


if __name__ == "__main__":
    json.dumps  # noqa: B018 (kept for debugging dumps)
    main()
