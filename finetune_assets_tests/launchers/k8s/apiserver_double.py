"""TEST DOUBLE of the Kubernetes API: a loopback HTTP server that runs Job pods as local processes.

Since the local control plane (``.ci/k8s``, docs/k8s-control-plane.md) runs the real API server,
Job controller, scheduler, garbage collector and Kueue, this double serves only (1) the tests that
need a fault no real component makes on purpose (:class:`Faults`: a pod pending while its peers
run, DNS lag, kubelet admission errors and evictions, image pull errors, cut log streams,
preemption / OOM kills of a chosen index, the recorded calls), which the ``cluster`` fixture gives
the double while every other test runs on the plane, and (2) machines without Go, where it is the
default. Its env handling is the node agent's (:mod:`kubelet`, one copy).

NOT a Kubernetes implementation. It serves exactly the REST calls the k8s launcher (and these tests)
make, with real Kubernetes JSON shapes, so the unmodified ``kubernetes`` client and launcher talk to
it through an ordinary kubeconfig (``server: http://127.0.0.1:PORT``):

- ``batch/v1`` Jobs: create / get / list (``fieldSelector=metadata.name=``) / delete / patch
  (``spec.suspend`` only)
- ``batch/v1`` Jobs also list by ``labelSelector``, and ``jobs/{name}/status`` get (the run
  launcher's ``read_namespaced_job_status``: the same object)
- ``v1`` Services: create / get / delete;  ``v1`` Secrets: create / get / delete (test set-up only)
- ``v1`` Pods: list (``labelSelector``, ``fieldSelector`` on ``metadata.name`` and ``status.phase``)
  / get, and ``pods/{name}/log``
  (``container``, ``tailLines``, ``follow`` as a chunked stream, like the real API server)

Every request is recorded in :attr:`KubeApiDouble.calls` as ``(verb, resource, user agent)`` so a
test can compare what the launcher really calls with what ``deploy/rbac.yaml`` grants; Jobs created
and deleted, with their labels, in :attr:`KubeApiDouble.job_log` (which gangs existed at once).

What it plays besides the API server:

- **Job controller** (``completionMode: Indexed``): one pod per index up to ``parallelism``, named
  ``<job>-<i>-<rand>``, labelled ``job-name`` / ``batch.kubernetes.io/job-completion-index`` and
  annotated with the index (and ``job-index-failure-count`` with ``backoffLimitPerIndex``),
  ``spec.hostname = <job>-<i>``, ``JOB_COMPLETION_INDEX`` injected into the container env. Also
  ``NonIndexed`` (the API default) with one completion and parallelism 1 only, the shape of a
  Dagster run worker's Job (``dagster_k8s.K8sRunLauncher``): one pod ``<job>-<rand>`` without index
  label, annotation, hostname or env, and no ``completedIndexes`` in the Job status. What
  to do after each pod change is decided by :mod:`job_controller` (``backoffLimit`` with its API
  default, ``backoffLimitPerIndex``, ``maxFailedIndexes``, ``podFailurePolicy``, ``suspend``,
  ``FailureTarget`` before ``Failed``), which passes cases transcribed from Kubernetes' own
  controller tests (``upstream_job_cases.py``). ``activeDeadlineSeconds`` -> ``DeadlineExceeded``.
  Delete with Background/Foreground propagation terminates and removes the pods.
  NOT played: ``successPolicy``, pod ``restartPolicy: OnFailure``, the exponential back-off delay
  before a replacement pod (replacements start at once: kinder), ``uncountedTerminatedPods``.
- **Kubelet**: runs each pod's container ``command + args`` as a separate process group, with the
  environment a container would get (image ``PATH``, ``HOSTNAME=<job>-<i>``, ``envFrom`` Secrets,
  ``env`` including ``valueFrom.fieldRef``/``secretKeyRef``, and ``$(VAR)`` expansion of env values,
  command and args exactly like the kubelet: ``$$`` escapes, unknown references stay literal).
  ``emptyDir`` mounts become per-pod folders: env values under a mount (``HOME=/tmp``,
  ``XDG_CACHE_HOME=/cache``) are rewritten to the pod's folder, unless they name an existing host
  path below the mount (a test's storage root under ``/tmp``: the shared storage); ``/dev/shm`` is a
  private tmpfs per pod (``unshare`` mount namespace, when the host allows it; see ``private_shm``),
  and the host filesystem plays the shared storage (paths in args and config files are not
  rewritten). Phase Pending -> Running -> Succeeded/Failed from the exit code (signal N -> exit code
  128+N). Users, capabilities, resources, node selectors and images are NOT enforced (schema tests
  cover the manifests; a real cluster covers the rest).
- **Node isolation and cluster DNS** (when the host permits ``unshare``: root, or user namespaces).
  Each pod process runs in its own UTS, PID and mount namespace: its own hostname ``<job>-<i>``, its
  own PID 1 (the container command, or a reaping shell when ``shareProcessNamespace`` is set, like
  the pause container), its own ``/dev/shm`` tmpfs, and its own ``/etc/hosts`` written the kubelet's
  way (``<podIP> <host>.<subdomain>.<ns>.svc.cluster.local <host>``). Each pod gets its own loopback
  address ``127.0.0.N`` as pod IP. Other pods' names (``<host>.<svc>.<ns>.svc``) resolve only after
  the pod is Running and ``faults.dns_lag_s`` has passed (the double rewrites every pod's hosts
  file, as CoreDNS would start answering); ``/etc/nsswitch.conf`` says ``hosts: files``, so nothing
  else resolves. So "who hosts the c10d store" and rank order behave as on a cluster. NOT isolated:
  the network namespace is shared, so ports are one space (a second process binding the same port
  fails instead of hosting a split-brain store as it could on a cluster), and NetworkPolicies are
  not enforced. Without ``unshare`` (:attr:`KubeApiDouble.isolated` is False) the double falls back
  to rewriting Service DNS names in args/env to pod 0's address at start, which is kinder; tests
  that need the unkind behaviour skip themselves.
- **Faults** (:class:`Faults`, set per test on :attr:`KubeApiDouble.faults`): per-index Pending
  delay, DNS lag, unschedulable pods (``PodScheduled=False/Unschedulable`` + a ``FailedScheduling``
  Event), pod creation refused (quota / admission: the Job gets ``FailedCreate`` Events and no
  pods), image pull failure (``ErrImagePull`` + Event), cut log streams; and
  :meth:`KubeApiDouble.evict` (Eviction API: ``DisruptionTarget`` condition, SIGTERM, the pod object
  goes away) and :meth:`KubeApiDouble.node_not_ready` (processes die silently, ``Ready=False``, then
  the taint manager's eviction); per index, the first N pods preempted (``faults.preempt``:
  ``DisruptionTarget`` ``PreemptionByScheduler``, SIGTERM, the pod goes away) or OOM-killed
  (``faults.oom_kill``: SIGKILL, exit code 137, terminated reason ``OOMKilled``) as soon as they
  run, so a retried index's first pod may have half-written its output. Memory limits themselves are
  NOT enforced.
- **API server trouble** (``faults.api_burst`` / ``api_outage_s`` / ``fail_job_deletes``): for the
  launcher's requests only (not the test harness' user agent), from the first request made while a
  pod runs: a burst of 429 with ``Retry-After``, 500, 503, 401 or a connection dropped without an
  answer, then an outage of 503s; Job deletes answering 500 N times. NOT played: watches (the
  launcher polls; so no 410 Gone), API priority-and-fairness queueing itself.
- **Kubelet trouble without ``DisruptionTarget``**: :meth:`KubeApiDouble.kubelet_evict` (emptyDir /
  node-pressure eviction: containers killed, exit 137, pod ``Failed``/``Evicted``) and
  ``faults.admission_errors`` (``Failed``/``UnexpectedAdmissionError``, never started).
- **Suspend** (Kueue): ``PATCH`` of ``spec.suspend`` (merge patch of that one field): a suspended
  Job's pods are deleted and it gets ``Suspended=True``; resumed, it gets pods again.
- **Garbage collector**: deleting an object deletes, in the background, every object whose
  ``ownerReferences`` name its uid (Job -> Service, run pod -> Job -> pods).
- ``v1`` Events: list (``fieldSelector`` on ``involvedObject.name``/``kind``); ``v1`` Pods: also
  create/delete of bare pods (a stand-in for the Dagster run pod that owns a training Job).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime as _dt
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from finetune_assets_tests.launchers.k8s import job_controller
from finetune_assets_tests.launchers.k8s.kubelet import (
    ContainerConfigError,
    container_env,
    isolation_flags,
    remap,
)

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_CORE = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|services|secrets|events)(?:/(?P<name>[^/]+)(?:/(?P<sub>log|status))?)?$"
)
_BATCH = re.compile(
    r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/(?P<res>jobs)(?:/(?P<name>[^/]+)(?:/(?P<sub>status))?)?$"
)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Faults:
    """What the cluster does wrong, per test (delays are in seconds, scaled down from minutes)."""

    # per completion index: Pending before start
    pending_s: dict[int, float] = field(default_factory=dict)
    dns_lag_s: float = 0.0  # a Running pod's DNS name resolves this long after it started
    unschedulable: str | None = None  # the scheduler's message; pods stay Pending
    refuse_pods: str | None = (
        None  # the admission/quota message; the Job controller cannot create pods
    )
    image_pull_error: str | None = None  # the kubelet's pull error; containers wait in ErrImagePull
    log_cut_s: float | None = (
        None  # follow streams end after this long (API server / kubelet hiccup)
    )
    # per completion index: how many of its first pods are preempted / OOM-killed as soon as they
    # run
    preempt: dict[int, int] = field(default_factory=dict)
    oom_kill: dict[int, int] = field(default_factory=dict)
    # API errors for the launcher's requests (not the test harness'), from the first request made
    # while a pod runs ("mid-training"): first the burst, one per request (status + Retry-After
    # seconds, or "reset": the connection drops without an answer), then api_outage_s of 503s.
    api_burst: list[tuple[int | str, float | None]] = field(default_factory=list)
    api_outage_s: float = 0.0
    fail_job_deletes: int = 0  # the launcher's next N Job deletes answer 500
    admission_errors: int = 0  # the next N pods fail kubelet admission (UnexpectedAdmissionError)
    api_injected: Counter = field(default_factory=Counter)  # what was injected, by status
    _outage_end: float | None = None
    _armed: bool = False


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.headers = code, reason, message, headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


class _Pod:
    """One running "pod": its API object, its process group and its log file."""

    def __init__(self, obj: dict[str, Any], root: Path):
        self.obj = obj
        self.root = root
        self.log_path = root / "container.log"
        self.proc: subprocess.Popen | None = None
        self.done = threading.Event()
        self.deleting = False
        self.ip = "127.0.0.1"
        self.disrupted = (
            False  # evicted: the Job controller does not count it as a failure (Ignore rule)
        )
        self.silent = False  # on a NotReady node: status no longer updated
        self.oom_killed = (
            False  # killed by the kernel at the memory limit: terminated reason OOMKilled
        )
        self.kubelet_reason: tuple[str, str] | None = (
            None  # status.reason/message of a kubelet eviction
        )
        self.attempt = 0  # pods of the same Job and index created before this one
        self.main_depth = 0  # how far below the Popen process the container's main process is
        self.hosts_path = root / "hosts"
        # written by the isolating shell once the pod's sandbox is set up (see _isolate)
        self.started_path = root / "started"

    @property
    def index(self) -> int:
        return int(self.obj["metadata"].get("annotations", {}).get(INDEX_KEY, -1))

    def main_pid(self) -> int | None:
        """The container's main process: what a kubelet sends SIGTERM to (not the whole group).

        None while the isolating shell still sets up the sandbox: its ``hostname`` and ``mount``
        children are not the container (a SIGTERM to one that has just exited would be lost).
        """
        if self.proc is None:
            return None
        pid, depth = self.proc.pid, self.main_depth
        if depth and not self.started_path.exists():
            return None
        for _ in range(depth):
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                return None
            if not children:
                return None
            pid = int(children[0])
        return pid

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    def terminate(self, grace_s: float) -> None:
        """The kubelet's way: SIGTERM to the main process, SIGKILL to all once the grace period
        is over, whatever became of the SIGTERM (ignored by a PID 1, or its target gone).
        """
        self.deleting = True
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            main = self.main_pid() if sig == signal.SIGTERM else None
            with contextlib.suppress(ProcessLookupError):
                if main is not None:
                    os.kill(main, sig)
                else:
                    os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


class KubeApiDouble:
    """The loopback API server + Job controller + kubelet described in the module docstring."""

    def __init__(self, workdir: Path, sandbox: Path, grace_s: float = 3.0):
        self.workdir = Path(workdir)  # the "image" working directory (repo root: package installed)
        self.sandbox = Path(sandbox)  # per-pod emptyDir folders and logs
        self.grace_s = grace_s
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (resource, ns, name) -> obj
        self.pods: dict[tuple[str, str], _Pod] = {}  # (ns, name) -> pod
        self.calls: list[tuple[str, str, str]] = []  # (verb, resource as RBAC names it, User-Agent)
        # Jobs as they came and went, in order: ("created" | "deleted", name, labels)
        self.job_log: list[tuple[str, str, dict[str, str]]] = []
        self._server: ThreadingHTTPServer | None = None
        self._rv = 0
        self.faults = Faults()
        self._next_ip = 2
        self.dns: dict[str, str] = {}  # published "<host>.<svc>.<ns>.svc" -> pod IP (CoreDNS)
        self.indexes: dict[
            tuple[str, str], _Indexes
        ] = {}  # (ns, job) -> the Job controller's per-index books
        # Own hostname, PID 1, /dev/shm and /etc/hosts per pod when the host allows it (see
        # docstring).
        self.isolated = isolation_flags() is not None
        self.private_shm = self.isolated

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> KubeApiDouble:
        double = self

        class Handler(_Handler):
            api = double

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, name="kube-api-double", daemon=True
        ).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig pointing at the double: the launcher loads it like any other cluster."""
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "double",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "double", "user": {"token": "test-double"}}],
            "contexts": [
                {
                    "name": "double",
                    "context": {"cluster": "double", "user": "double", "namespace": namespace},
                }
            ],
        }
        path.write_text(json.dumps(cfg))
        return path

    def stop(self) -> None:
        with self.lock:
            pods = list(self.pods.values())
        for pod in pods:
            pod.terminate(0.5)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def live_processes(self) -> list[str]:
        with self.lock:
            return [
                p.name for p in self.pods.values() if p.proc is not None and p.proc.poll() is None
            ]

    def kill_pod(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Chaos helper: signal a pod's whole process group (a node dying)."""
        pod = self._pod_named(name)
        assert pod.proc is not None
        os.killpg(pod.proc.pid, sig)

    def _pod_named(self, name: str) -> _Pod:
        with self.lock:
            return next(p for (ns, n), p in self.pods.items() if n == name)

    def evict(self, name: str, reason: str = "EvictionByEvictionAPI") -> None:
        """The Eviction API (drain, spot reclaim, autoscaler): ``DisruptionTarget``, SIGTERM, pod
        deleted.
        """
        pod = self._pod_named(name)
        with self.lock:
            pod.disrupted = True
            pod.obj["metadata"]["deletionTimestamp"] = _now()
            pod.obj["status"]["conditions"].append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": reason,
                    "message": "Eviction API: evicting",
                    "lastTransitionTime": _now(),
                }
            )
        ns = pod.obj["metadata"]["namespace"]

        def go() -> None:
            pod.terminate(self.grace_s)
            pod.done.wait(10)
            # the terminated pod is visible a moment, then removed (finalizers done)
            time.sleep(1.0)
            with self.lock:
                self.pods.pop((ns, pod.name), None)

        threading.Thread(target=go, daemon=True).start()

    def kubelet_evict(
        self,
        name: str,
        reason: str = "Evicted",
        message: str = (
            "Pod ephemeral local storage usage exceeds the total limit of containers 8Gi."
        ),
    ) -> None:
        """A kubelet-initiated eviction (emptyDir / ephemeral-storage limit, node pressure): the
        containers are killed (exit 137), the pod ends Failed with ``status.reason`` and NO
        ``DisruptionTarget``.
        """
        pod = self._pod_named(name)
        pod.kubelet_reason = (reason, message)
        if pod.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.proc.pid, signal.SIGKILL)

    def node_not_ready(self, name: str, evict_after_s: float = 2.0) -> None:
        """The pod's node stops reporting: its processes die silently, ``Ready=False``, later
        evicted.
        """
        pod = self._pod_named(name)
        with self.lock:
            pod.silent = True
            pod.obj["status"]["conditions"].append(
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "NodeNotReady",
                    "message": "the node this pod runs on is not ready",
                    "lastTransitionTime": _now(),
                }
            )
        if pod.proc is not None:
            os.killpg(pod.proc.pid, signal.SIGKILL)
        timer = threading.Timer(evict_after_s, self.evict, args=(name, "DeletionByTaintManager"))
        timer.daemon = True
        timer.start()

    def add_event(
        self, ns: str, obj: dict[str, Any], reason: str, message: str, kind_type: str = "Warning"
    ) -> None:
        meta = obj["metadata"]
        with self.lock:
            key = ("events", ns, f"{meta['name']}.{reason}")
            event = self.objects.get(key)
            if event is not None:
                event["count"] += 1
                event["lastTimestamp"] = _now()
                return
            self._rv += 1
            self.objects[key] = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": key[2],
                    "namespace": ns,
                    "uid": str(uuid.uuid4()),
                    "resourceVersion": str(self._rv),
                },
                "involvedObject": {
                    "kind": obj.get("kind"),
                    "name": meta["name"],
                    "namespace": ns,
                    "uid": meta.get("uid"),
                },
                "reason": reason,
                "message": message,
                "type": kind_type,
                "count": 1,
                "firstTimestamp": _now(),
                "lastTimestamp": _now(),
                "source": {"component": "double"},
            }

    # -- REST -----------------------------------------------------------------------------------

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        body: dict[str, Any] | None,
        agent: str = "",
    ):
        m = _CORE.match(path) or _BATCH.match(path)
        if not m:
            raise ApiError(404, "NotFound", f"the double does not serve {method} {path}")
        ns, res, name, sub = m["ns"], m["res"], m["name"], m["sub"]
        verb = {
            "POST": "create",
            "DELETE": "delete",
            "PATCH": "patch",
            "GET": "get" if name else "list",
        }.get(method)
        if verb is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} {path}")
        with self.lock:
            self.calls.append((verb, f"{res}/{sub}" if sub else res, agent))
        if not agent.startswith("finetune-assets-tests"):
            self._inject_api_error(verb, res)
        if verb == "patch" and res == "jobs":
            return 200, self._patch_job(ns, name, body or {})
        if res == "pods" and sub == "log":
            return ("log", ns, name, query)
        if verb == "create" and res == "pods":
            return 201, self._create_bare_pod(ns, body or {})
        if verb == "create":
            return 201, self._create(res, ns, body or {})
        if verb == "delete":
            return 200, self._delete(res, ns, name, body or {})
        if verb == "get":
            return 200, self._get(res, ns, name)
        return 200, self._list(res, ns, query)

    def _inject_api_error(self, verb: str, res: str) -> None:
        """``faults.api_burst`` / ``api_outage_s`` / ``fail_job_deletes`` (see :class:`Faults`)."""
        f = self.faults
        with self.lock:
            if verb == "delete" and res == "jobs" and f.fail_job_deletes > 0:
                f.fail_job_deletes -= 1
                f.api_injected[500] += 1
                raise ApiError(500, "InternalError", "etcdserver: request timed out")
            if not (f.api_burst or f.api_outage_s):
                return
            if not f._armed:  # mid-training: once a pod process runs
                if not any(
                    p.proc is not None and p.proc.poll() is None for p in self.pods.values()
                ):
                    return
                f._armed = True
            if f.api_burst:
                status, wait = f.api_burst.pop(0)
                f.api_injected[status] += 1
                if status == "reset":
                    raise ConnectionResetError("injected connection reset")
                headers = {"Retry-After": str(int(wait))} if wait is not None else {}
                reason = {429: "TooManyRequests", 401: "Unauthorized"}.get(
                    int(status), "InternalError"
                )
                raise ApiError(int(status), reason, f"injected {status}", headers)
            if f._outage_end is None:
                f._outage_end = time.monotonic() + f.api_outage_s
            if time.monotonic() < f._outage_end:
                f.api_injected[503] += 1
                raise ApiError(
                    503, "ServiceUnavailable", "injected outage: the API server is restarting"
                )

    def _patch_job(self, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of ``spec.suspend`` (Kueue admission, the launcher's fallback to a
        failed delete).
        """
        with self.lock:
            job = self.objects.get(("jobs", ns, name))
            if job is None:
                raise ApiError(404, "NotFound", f'jobs.batch "{name}" not found')
            if set(patch) - {"spec"} or set(patch.get("spec", {})) - {"suspend"}:
                raise ApiError(422, "Invalid", "the double patches only spec.suspend")
            job["spec"]["suspend"] = bool(patch["spec"]["suspend"])
            if not job["spec"]["suspend"]:  # resumed: the Suspended condition turns False
                for c in job["status"].get("conditions", []):
                    if c["type"] == "Suspended":
                        c.update(status="False", reason="JobResumed", message="Job resumed")
        self._fill(ns, name)
        return self._get("jobs", ns, name)

    def _create(self, res: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name is required")
        if meta.setdefault("namespace", ns) != ns:
            raise ApiError(
                400, "BadRequest", "the namespace of the object does not match the request"
            )
        with self.lock:
            if (res, ns, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{res} "{name}" already exists')
            self._rv += 1
            meta.update(
                uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion=str(self._rv)
            )
            if res == "secrets":
                data = dict(obj.get("data") or {})
                for k, v in (obj.pop("stringData", None) or {}).items():
                    data[k] = base64.b64encode(v.encode()).decode()
                obj["data"] = data
            if res == "jobs":
                obj["status"] = {"startTime": _now(), "active": 0, "succeeded": 0, "failed": 0}
                self.indexes[(ns, name)] = _Indexes()
                self.job_log.append(("created", name, dict(meta.get("labels") or {})))
            self.objects[(res, ns, name)] = obj
        if res == "jobs":
            self._start_job(ns, obj)
        return obj

    def _create_bare_pod(self, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        """A pod without a Job and without a process: plays the Dagster run pod that owns a
        training Job.
        """
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
        obj["status"] = {"phase": "Running", "conditions": [], "containerStatuses": []}
        pod = _Pod(obj, self.sandbox / meta["name"])
        pod.done.set()
        with self.lock:
            if (ns, meta["name"]) in self.pods:
                raise ApiError(409, "AlreadyExists", f'pods "{meta["name"]}" already exists')
            self.pods[(ns, meta["name"])] = pod
        return copy.deepcopy(obj)

    def _get(self, res: str, ns: str, name: str) -> dict[str, Any]:
        with self.lock:
            if res == "pods":
                pod = self.pods.get((ns, name))
                if pod is None:
                    raise ApiError(404, "NotFound", f'pods "{name}" not found')
                return copy.deepcopy(pod.obj)
            obj = self.objects.get((res, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{res} "{name}" not found')
            return copy.deepcopy(obj)

    def _list(self, res: str, ns: str, query: dict[str, list[str]]) -> dict[str, Any]:
        labels = _parse_selector(query.get("labelSelector", [""])[0])
        fields = _parse_selector(query.get("fieldSelector", [""])[0])
        with self.lock:
            if res == "pods":
                items = [copy.deepcopy(p.obj) for (pns, _), p in self.pods.items() if pns == ns]
            else:
                items = [
                    copy.deepcopy(o)
                    for (r, ons, _), o in self.objects.items()
                    if r == res and ons == ns
                ]
        items = [
            o
            for o in items
            if _matches(o["metadata"].get("labels") or {}, labels)
            and _matches(
                {
                    "metadata.name": o["metadata"]["name"],
                    "status.phase": (o.get("status") or {}).get("phase") if res == "pods" else None,
                    **{
                        f"involvedObject.{k}": v for k, v in (o.get("involvedObject") or {}).items()
                    },
                },
                fields,
            )
        ]
        kind = {
            "pods": "PodList",
            "jobs": "JobList",
            "services": "ServiceList",
            "secrets": "SecretList",
            "events": "EventList",
        }[res]
        return {
            "kind": kind,
            "apiVersion": "batch/v1" if res == "jobs" else "v1",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _delete(self, res: str, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if res == "pods":
            with self.lock:
                pod = self.pods.get((ns, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            pod.deleting = True
            threading.Thread(target=self._reap, args=(ns, [pod]), daemon=True).start()
            self._collect_garbage(ns, pod.obj["metadata"]["uid"])
            return {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}
        with self.lock:
            if (res, ns, name) not in self.objects:
                raise ApiError(404, "NotFound", f'{res} "{name}" not found')
            obj = self.objects.pop((res, ns, name))
            if res == "jobs":
                self.job_log.append(("deleted", name, dict(obj["metadata"].get("labels") or {})))
            pods = [
                p
                for (pns, _), p in self.pods.items()
                if pns == ns
                and res == "jobs"
                and p.obj["metadata"]["labels"].get("job-name") == name
            ]
        if res == "jobs" and body.get("propagationPolicy", "Background") != "Orphan":
            for pod in pods:
                pod.deleting = True
            threading.Thread(target=self._reap, args=(ns, pods), daemon=True).start()
        if body.get("propagationPolicy") != "Orphan":
            self._collect_garbage(ns, obj["metadata"].get("uid"))
        return (
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Success",
                "details": {"name": name, "kind": res},
                "metadata": {},
            }
            if obj
            else {}
        )

    def _collect_garbage(self, ns: str, owner_uid: str | None) -> None:
        """Kubernetes' garbage collector: dependents of a deleted owner go too (Background)."""
        if owner_uid is None:
            return
        with self.lock:
            doomed = [
                (r, n)
                for (r, ons, n), o in self.objects.items()
                if ons == ns
                and any(
                    ref.get("uid") == owner_uid
                    for ref in o["metadata"].get("ownerReferences") or []
                )
            ]
        for res, name in doomed:
            try:
                self._delete(res, ns, name, {"propagationPolicy": "Background"})
            except ApiError:
                pass

    def _reap(self, ns: str, pods: list[_Pod]) -> None:
        for pod in pods:
            pod.terminate(self.grace_s)
            pod.done.wait(10)
            with self.lock:
                self.pods.pop((ns, pod.name), None)

    # -- Job controller -----------------------------------------------------------------------

    def _start_job(self, ns: str, job: dict[str, Any]) -> None:
        spec = job["spec"]
        if spec.get("completionMode", "NonIndexed") != "Indexed" and (
            int(spec.get("completions") or 1) != 1 or int(spec.get("parallelism", 1)) != 1
        ):
            raise ApiError(
                422, "Invalid", "the double runs Indexed Jobs and single-pod NonIndexed Jobs only"
            )
        name = job["metadata"]["name"]
        self._fill(ns, name)
        deadline = spec.get("activeDeadlineSeconds")
        if deadline:

            def expire() -> None:
                if not self._job_finished(ns, name):
                    self._finish_job(
                        ns,
                        name,
                        "Failed",
                        "DeadlineExceeded",
                        "Job was active longer than specified deadline",
                    )

            timer = threading.Timer(float(deadline), expire)
            timer.daemon = True
            timer.start()

    def _fill(self, ns: str, name: str) -> None:
        """One pass of the Job controller (:func:`job_controller.sync` decides): status, new
        pods, kills.

        One pass at a time, its new pods recorded before the lock is let go: pods that end at the
        same moment each trigger a pass, and a pass that decided before the other's new pods were
        recorded would create the same replacements again (upstream: one worker per Job key and
        the creation expectations).
        """
        with self.lock:
            job, books = self.objects.get(("jobs", ns, name)), self.indexes.get((ns, name))
            if job is None or books is None or self._job_finished(ns, name):
                return
            status = job["status"]
            if any(c["type"] == "FailureTarget" for c in status.get("conditions", [])):
                self._finish_when_gone(ns, job, books)  # the terminal condition waits for the pods
                return
            result = job_controller.sync(job["spec"], list(books.records.values()), ns)
            status.update(succeeded=result.succeeded, failed=result.failed)
            if job["spec"].get("completionMode") == "Indexed":
                status["completedIndexes"] = result.completed_indexes
            if result.failed_indexes is not None:
                status["failedIndexes"] = result.failed_indexes
            for ctype, reason, message in result.conditions:
                if not any(c["type"] == ctype for c in status.get("conditions", [])):
                    self._set_condition(job, ctype, reason, message)
            if any(c[0] == "Complete" for c in result.conditions):
                status["completionTime"] = _now()
            doomed = [p for n in result.to_delete if (p := self.pods.get((ns, n))) is not None]
            for pod in doomed:
                books.records[pod.name].deleting = True
            for index in result.to_create:
                self._create_pod(ns, job, index)
            status["active"] = sum(
                1
                for r in books.records.values()
                if r.phase in ("Pending", "Running") and not r.deleting
            )
        if job["spec"].get("suspend"):  # a suspended Job's pods are deleted (the Job stays)
            threading.Thread(target=self._reap, args=(ns, doomed), daemon=True).start()
        # a failed Job's remaining pods are terminated (kept here: their logs feed failure reports)
        else:
            for pod in doomed:
                threading.Thread(target=pod.terminate, args=(self.grace_s,), daemon=True).start()

    def _finish_when_gone(self, ns: str, job: dict[str, Any], books: _Indexes) -> None:
        """``Failed`` follows ``FailureTarget`` once no pod of the Job is left running
        (Kubernetes >= 1.31).
        """
        if not all(self._gone(ns, r.name) for r in books.records.values()):
            return
        target = next(c for c in job["status"]["conditions"] if c["type"] == "FailureTarget")
        if not any(c["type"] == "Failed" for c in job["status"]["conditions"]):
            self._set_condition(job, "Failed", target["reason"], target["message"])
        job["status"]["active"] = 0

    def _gone(self, ns: str, name: str) -> bool:
        pod = self.pods.get((ns, name))
        return pod is None or pod.done.is_set()

    def _create_pod(self, ns: str, job: dict[str, Any], index: int) -> None:
        job_name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        # quota / LimitRange / Pod Security admission: no pod, an Event on the Job
        if self.faults.refuse_pods:
            self.add_event(ns, job, "FailedCreate", f"Error creating: {self.faults.refuse_pods}")
            return
        template = copy.deepcopy(job["spec"]["template"])
        meta = template.get("metadata") or {}
        # NonIndexed (the API default; a Dagster run worker's Job): `<job>-<rand>`, no index label,
        # annotation, hostname or JOB_COMPLETION_INDEX; the controller's books still use index 0.
        indexed = job["spec"].get("completionMode") == "Indexed"
        suffix = uuid.uuid4().hex[:5]
        pod_name = f"{job_name}-{index}-{suffix}" if indexed else f"{job_name}-{suffix}"
        labels = {
            **(meta.get("labels") or {}),
            "job-name": job_name,
            "batch.kubernetes.io/job-name": job_name,
            "controller-uid": uid,
            "batch.kubernetes.io/controller-uid": uid,
            **({INDEX_KEY: str(index)} if indexed else {}),
        }
        spec = template["spec"]
        if indexed:
            spec["hostname"] = f"{job_name}-{index}"
            for c in spec["containers"]:
                env = c.setdefault("env", [])
                if not any(e["name"] == "JOB_COMPLETION_INDEX" for e in env):
                    env.append(
                        {
                            "name": "JOB_COMPLETION_INDEX",
                            "valueFrom": {
                                "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}
                            },
                        }
                    )
        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "uid": str(uuid.uuid4()),
                "labels": labels,
                "annotations": {
                    **(meta.get("annotations") or {}),
                    **({INDEX_KEY: str(index)} if indexed else {}),
                },
                "creationTimestamp": _now(),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job_name,
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {
                "phase": "Pending",
                "conditions": [],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "started": False,
                        "state": {"waiting": {"reason": "ContainerCreating"}},
                    }
                    for c in spec["containers"]
                ],
            },
        }
        books = self.indexes[(ns, job_name)]
        counted = sum(
            1
            for r in books.records.values()
            if r.index == index
            and r.phase == "Failed"
            and job_controller.failure_action(job["spec"], r, ns)[0] != "Ignore"
        )
        if "backoffLimitPerIndex" in job["spec"]:
            obj["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] = str(
                counted
            )
        root = self.sandbox / pod_name
        root.mkdir(parents=True)
        pod = _Pod(obj, root)
        with self.lock:
            key = (ns, job_name)
            pod.attempt = self.indexes[key].attempts[index]
            self.indexes[key].attempts[index] += 1
            pod.ip = f"127.0.{self._next_ip // 250}.{self._next_ip % 250 + 2}"
            self._next_ip += 1
            self.pods[(ns, pod_name)] = pod
            books.records[pod_name] = job_controller.Pod(
                pod_name, index, "Pending", failure_count=counted
            )
        threading.Thread(
            target=self._run_pod, args=(ns, job_name, pod), name=pod_name, daemon=True
        ).start()

    def _schedule_and_pull(self, ns: str, pod: _Pod) -> bool:
        """Pending: scheduling, image pull, faults. False when the pod never gets to start."""
        f, status = self.faults, pod.obj["status"]
        # kubelet admission fails (device plugin restarted): Failed, never ran
        if f.admission_errors > 0:
            with self.lock:
                f.admission_errors -= 1
                status.update(
                    phase="Failed",
                    reason="UnexpectedAdmissionError",
                    message=(
                        "Allocate failed due to no healthy devices present; cannot allocate "
                        "unhealthy devices "
                        "nvidia.com/gpu, which is unexpected"
                    ),
                )
            return False
        if f.unschedulable:
            with self.lock:
                status["conditions"].append(
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": f.unschedulable,
                        "lastTransitionTime": _now(),
                    }
                )
            self.add_event(ns, pod.obj, "FailedScheduling", f.unschedulable)
            return False
        with self.lock:
            status["conditions"].append(
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}
            )
        if f.image_pull_error:
            image = pod.obj["spec"]["containers"][0].get("image", "")
            with self.lock:
                status["containerStatuses"][0]["state"] = {
                    "waiting": {"reason": "ErrImagePull", "message": f.image_pull_error}
                }
            self.add_event(
                ns, pod.obj, "Failed", f'Failed to pull image "{image}": {f.image_pull_error}'
            )
            return False
        end = time.monotonic() + f.pending_s.get(pod.index, 0.0)
        while time.monotonic() < end:  # a slow node scale-up or image pull
            if pod.deleting:
                return False
            time.sleep(0.05)
        return True

    def _run_pod(self, ns: str, job_name: str, pod: _Pod) -> None:
        container = pod.obj["spec"]["containers"][0]
        if not self._schedule_and_pull(ns, pod):
            pod.done.set()
            # admission error: a failure without an exit code
            if pod.obj["status"]["phase"] == "Failed":
                with self.lock:
                    if (record := self.indexes[(ns, job_name)].records.get(pod.name)) is not None:
                        record.phase = "Failed"
                self._fill(ns, job_name)
            return
        try:
            argv, env = self._container_process(ns, pod, container)
        except ApiError as e:  # e.g. a missing Secret: the kubelet keeps the pod waiting
            with self.lock:
                pod.obj["status"]["containerStatuses"][0]["state"] = {
                    "waiting": {"reason": "CreateContainerConfigError", "message": e.message}
                }
            pod.done.set()
            return
        with open(pod.log_path, "wb") as out:
            with self.lock:
                if pod.deleting:
                    pod.done.set()
                    return
                try:
                    pod.proc = subprocess.Popen(
                        argv,
                        env=env,
                        cwd=self.workdir,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                except OSError as e:  # like a runtime StartError: the container never ran
                    out.write(f"failed to start {argv[:1]}: {e}\n".encode())
                    pod.proc = subprocess.Popen(["false"], stdout=out, start_new_session=True)
                started = _now()
                pod.obj["status"].update(phase="Running", podIP=pod.ip, startTime=started)
                pod.obj["status"]["containerStatuses"][0].update(
                    ready=True, started=True, state={"running": {"startedAt": started}}
                )
            self._publish_dns_later(ns, pod)
            self._inject_faults(pod)
            rc = pod.proc.wait()
        # killed by signal N -> 128 + N, as the container runtime reports
        code = 128 - rc if rc < 0 else rc
        if pod.silent:  # a NotReady node reports nothing; the taint manager's eviction follows
            pod.done.set()
            return
        with self.lock:
            pod.obj["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
            # a kubelet eviction: no DisruptionTarget, a pod-level reason
            if pod.kubelet_reason is not None:
                pod.obj["status"]["reason"], pod.obj["status"]["message"] = pod.kubelet_reason
            pod.obj["status"]["containerStatuses"][0].update(
                ready=False,
                started=False,
                state={
                    "terminated": {
                        "exitCode": code,
                        "reason": "Completed"
                        if code == 0
                        else "OOMKilled"
                        if pod.oom_killed
                        else "Error",
                        "startedAt": pod.obj["status"].get("startTime"),
                        "finishedAt": _now(),
                    }
                },
            )
        pod.done.set()
        self._on_pod_finished(ns, job_name, pod, code)

    def _container_process(
        self, ns: str, pod: _Pod, c: dict[str, Any]
    ) -> tuple[list[str], dict[str, str]]:
        mounts = {
            m["mountPath"]: pod.root / "volumes" / m["name"]
            for m in c.get("volumeMounts", [])
            if m["mountPath"] != "/dev/shm" and self._is_empty_dir(pod, m["name"])
        }
        for path in mounts.values():
            path.mkdir(parents=True, exist_ok=True)
        base = {"HOSTNAME": pod.obj["spec"].get("hostname") or pod.name}
        fields = {
            "metadata.name": pod.obj["metadata"]["name"],
            "metadata.namespace": ns,
            "status.podIP": pod.ip,
        }

        def read(kind: str, name: str) -> dict[str, str] | None:
            if kind != "secret":
                raise ContainerConfigError("the double only supports Secret references")
            secret = self.objects.get(("secrets", ns, name))
            if secret is None:
                return None
            return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

        try:
            argv, env = container_env(c, pod.obj["metadata"], base, fields, read)
        except ContainerConfigError as e:
            raise ApiError(404, "NotFound", str(e)) from e
        if self.isolated:
            argv = self._isolate(pod, env["HOSTNAME"], argv)
        # Env values under an emptyDir mount (HOME=/tmp, XDG_CACHE_HOME=/cache, ...) point into the
        # pod's own folder; args and files are left alone: the host filesystem plays the shared
        # storage (the RWX volume / object store of a real cluster).
        # PATH is the "image's" (this venv), not a manifest value: never remapped, even when the
        # checkout itself lives under /tmp (as a CI clone may) and /tmp is an emptyDir in the pod.
        env = {k: self._dns(ns, v if k == "PATH" else remap(v, mounts)) for k, v in env.items()}
        return [self._dns(ns, a) for a in argv], env

    def _isolate(self, pod: _Pod, hostname: str, argv: list[str]) -> list[str]:
        """Own hostname, PID 1, /dev/shm and /etc/hosts (kubelet-managed) for the pod's process."""
        spec = pod.obj["spec"]
        fqdn = (
            f"{hostname}.{spec['subdomain']}.{pod.obj['metadata']['namespace']}.svc.cluster.local"
            if spec.get("subdomain")
            else hostname
        )
        with self.lock:  # one order with publish(): a name published meanwhile is never missed
            pod.own_hosts = f"127.0.0.1\tlocalhost\n{pod.ip}\t{fqdn} {hostname}\n"
            pod.hosts_path.write_text(pod.own_hosts + self._dns_lines())
        # names answer from the hosts file only: unknown = NXDOMAIN at once
        nsswitch = pod.root / "nsswitch.conf"
        nsswitch.write_text("passwd: files\ngroup: files\nhosts: files\n")
        q = shlex.quote
        setup = (
            f"hostname {q(hostname)} && mount --bind {q(str(pod.hosts_path))} /etc/hosts && "
            f"mount --bind {q(str(nsswitch))} /etc/nsswitch.conf && mount -t tmpfs -o size=1g "
            "tmpfs /dev/shm"
        )
        # the pause container is PID 1 and reaps; the command is not PID 1
        if spec.get("shareProcessNamespace"):
            pod.main_depth = 2
            run = '"$0" "$@" & wait $!'
        # the container's command is PID 1 of its namespace (signals without handlers are ignored)
        else:
            pod.main_depth = 1
            run = 'exec "$0" "$@"'
        # `: >` is the shell's own: no child that main_pid could take for the container
        started = f": > {q(str(pod.started_path))}"
        return [*isolation_flags(), "sh", "-c", f"{setup} && {started} && {run}", *argv]

    def _dns_lines(self) -> str:
        with self.lock:
            return "".join(f"{ip}\t{name}\n" for name, ip in self.dns.items())

    def _publish_dns_later(self, ns: str, pod: _Pod) -> None:
        """CoreDNS answers for ``<host>.<subdomain>.<ns>.svc`` once the pod runs, after
        ``dns_lag_s``.
        """
        spec = pod.obj["spec"]
        if not spec.get("subdomain"):
            return

        def publish() -> None:
            if pod.deleting or pod.done.is_set():
                return
            name = f"{spec['hostname']}.{spec['subdomain']}.{ns}.svc"
            with self.lock:  # every pod with a hosts file, started or about to start (see _isolate)
                self.dns[name] = self.dns[name + ".cluster.local"] = pod.ip
                lines = self._dns_lines()
                for p in [p for p in self.pods.values() if hasattr(p, "own_hosts")]:
                    with contextlib.suppress(FileNotFoundError), open(p.hosts_path, "r+") as f:
                        f.truncate(0)  # rewritten in place: the bind mount follows the inode
                        f.write(p.own_hosts + lines)

        timer = threading.Timer(self.faults.dns_lag_s, publish)
        timer.daemon = True
        timer.start()

    def _is_empty_dir(self, pod: _Pod, volume: str) -> bool:
        return any(
            v["name"] == volume and "emptyDir" in v for v in pod.obj["spec"].get("volumes", [])
        )

    def _dns(self, ns: str, value: str) -> str:
        """Fallback without isolation: Service names become pod 0's address at start (kinder than
        CoreDNS).
        """
        if self.isolated:
            return value
        with self.lock:
            services = {(n, s) for (r, s, n) in self.objects if r == "services"}
            ips = {
                (p.obj["spec"].get("subdomain"), p.obj["spec"].get("hostname")): p.ip
                for p in self.pods.values()
            }

        def resolve(
            m: re.Match,
        ) -> str:  # the Service may be created just after the Job (owner reference)
            if (m["svc"], m["host"]) in ips:
                return ips[(m["svc"], m["host"])]
            return "127.0.0.1" if (m["svc"], m["ns"]) in services else m.group(0)

        return re.sub(
            r"(?P<host>[a-z0-9-]+)\.(?P<svc>[a-z0-9-]+)\.(?P<ns>[a-z0-9-]+)\.svc(?:\.cluster\.local)?",
            resolve,
            value,
        )

    def _job_finished(self, ns: str, name: str) -> bool:
        with self.lock:
            job = self.objects.get(("jobs", ns, name))
            return job is None or any(
                c["type"] in ("Complete", "Failed") for c in job["status"].get("conditions", [])
            )

    def _inject_faults(self, pod: _Pod) -> None:
        """``faults.preempt`` / ``faults.oom_kill``: the pod's first attempts die right after
        they start running: once the container's main process exists (not the sandbox set-up;
        see :meth:`_Pod.main_pid`), or after 5 s.
        """
        preempt, oom = (
            pod.attempt < self.faults.preempt.get(pod.index, 0),
            pod.attempt < self.faults.oom_kill.get(pod.index, 0),
        )
        deadline = time.monotonic() + 5.0
        while (preempt or oom) and pod.main_pid() is None and time.monotonic() < deadline:
            # `unshare` blocks SIGTERM until it has forked the pod's process: hit that process
            time.sleep(0.01)
        if preempt:
            self.evict(pod.name, "PreemptionByScheduler")
        elif oom and pod.proc is not None:
            pod.oom_killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.proc.pid, signal.SIGKILL)

    def _on_pod_finished(self, ns: str, job_name: str, pod: _Pod, code: int) -> None:
        """The pod's record as the controller reads it (phase, exit code, DisruptionTarget), then
        a sync.
        """
        with self.lock:
            job, books = self.objects.get(("jobs", ns, job_name)), self.indexes.get((ns, job_name))
            if job is None or books is None or pod.name not in books.records:
                return
            record = books.records[pod.name]
            # a pod the controller deleted (suspend, failed Job) is not a new failure
            record.phase = "Gone" if record.deleting else "Succeeded" if code == 0 else "Failed"
            record.exit_codes = {c["name"]: code for c in pod.obj["spec"]["containers"][:1]}
            record.conditions = ("DisruptionTarget",) if pod.disrupted else ()
        self._fill(ns, job_name)

    def _finish_job(self, ns: str, name: str, ctype: str, reason: str, message: str) -> None:
        with self.lock:
            job = self.objects.get(("jobs", ns, name))
            if job is None:
                return
            if ctype == "Failed":
                self._set_condition(job, "FailureTarget", reason, message)
            self._set_condition(job, ctype, reason, message)
            peers = [
                p
                for (pns, _), p in self.pods.items()
                if pns == ns
                and p.obj["metadata"]["labels"].get("job-name") == name
                and not p.done.is_set()
            ]
        for pod in peers:  # the controller terminates the remaining pods of a failed Job
            threading.Thread(target=pod.terminate, args=(self.grace_s,), daemon=True).start()

    @staticmethod
    def _set_condition(job: dict[str, Any], ctype: str, reason: str, message: str) -> None:
        job["status"].setdefault("conditions", []).append(
            {
                "type": ctype,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastProbeTime": _now(),
                "lastTransitionTime": _now(),
            }
        )

    # -- logs -----------------------------------------------------------------------------------

    def pod_for_logs(self, ns: str, name: str) -> _Pod:
        with self.lock:
            pod = self.pods.get((ns, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        if pod.proc is None:
            raise ApiError(
                400,
                "BadRequest",
                f'container in pod "{name}" is waiting to start: ContainerCreating',
            )
        return pod


@dataclass
class _Indexes:
    """What the Job controller knows of a Job's pods (the real one: its informer cache and
    finalizers).
    """

    # pod name -> what it reads
    records: dict[str, job_controller.Pod] = field(default_factory=dict)
    attempts: Counter = field(default_factory=Counter)  # pods created per index


def _parse_selector(text: str) -> list[tuple[str, str, str | None]]:
    out = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            out.append((k, "!=", v))
        elif "=" in term:
            k, v = re.split(r"==?", term, maxsplit=1)
            out.append((k, "=", v))
        else:
            out.append((term.lstrip("!"), "!" if term.startswith("!") else "exists", None))
    return out


def _matches(values: dict[str, str], terms: list[tuple[str, str, str | None]]) -> bool:
    for key, op, val in terms:
        have = values.get(key)
        if (
            (op == "=" and have != val)
            or (op == "!=" and have == val)
            or (op == "exists" and have is None)
            or (op == "!" and have is not None)
        ):
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    api: KubeApiDouble
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send_json(
        self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, method: str) -> None:
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        try:
            result = self.api.handle(
                method, url.path, parse_qs(url.query), body, self.headers.get("User-Agent", "")
            )
            if result[0] == "log":
                _, ns, name, query = result
                self._logs(self.api.pod_for_logs(ns, name), query)
                return
            self._send_json(*result)
        except ApiError as e:
            self._send_json(e.code, e.body(), e.headers)
        except ConnectionResetError:  # injected: drop the connection without an answer
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    do_GET = lambda self: self._dispatch("GET")  # noqa: E731
    do_POST = lambda self: self._dispatch("POST")  # noqa: E731
    do_DELETE = lambda self: self._dispatch("DELETE")  # noqa: E731
    do_PATCH = lambda self: self._dispatch("PATCH")  # noqa: E731

    def _logs(self, pod: _Pod, query: dict[str, list[str]]) -> None:
        follow = query.get("follow", ["false"])[0].lower() == "true"
        tail = query.get("tailLines", [None])[0]
        if not follow:
            lines = pod.log_path.read_bytes().splitlines(keepends=True)
            data = b"".join(lines[-int(tail) :] if tail else lines)
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
        cut = self.api.faults.log_cut_s
        cut_at = time.monotonic() + cut if cut else None
        try:
            with open(pod.log_path, "rb") as f:
                while True:
                    # the connection drops mid-stream
                    if cut_at is not None and time.monotonic() > cut_at:
                        self.close_connection = True
                        return
                    finished = pod.done.is_set()
                    chunk = f.read(65536)
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    elif finished:
                        break
                    else:
                        time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


def cleanup_sandbox(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
