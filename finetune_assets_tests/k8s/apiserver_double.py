"""TEST DOUBLE of the Kubernetes API: a loopback HTTP server that runs Job pods as local processes.

NOT a Kubernetes implementation. It serves exactly the REST calls the k8s launcher (and these tests)
make, with real Kubernetes JSON shapes, so the unmodified ``kubernetes`` client and launcher talk to
it through an ordinary kubeconfig (``server: http://127.0.0.1:PORT``):

- ``batch/v1`` Jobs: create / get / list (``fieldSelector=metadata.name=``) / delete
- ``v1`` Services: create / get / delete;  ``v1`` Secrets: create / get / delete (test set-up only)
- ``v1`` Pods: list (``labelSelector``, ``fieldSelector``) / get, and ``pods/{name}/log``
  (``container``, ``tailLines``, ``follow`` as a chunked stream, like the real API server)

Every request is recorded in :attr:`KubeApiDouble.calls` as ``(verb, resource, user agent)`` so a test can
compare what the launcher really calls with what ``deploy/rbac.yaml`` grants.

What it plays besides the API server:

- **Job controller** (``completionMode: Indexed``): one pod per index up to ``parallelism``, named
  ``<job>-<i>-<rand>``, labelled ``job-name`` / ``batch.kubernetes.io/job-completion-index`` and
  annotated with the index, ``spec.hostname = <job>-<i>``, ``JOB_COMPLETION_INDEX`` injected into
  the container env; ``backoffLimit``, the ``FailJob`` on-exit-code ``podFailurePolicy`` rule and
  ``activeDeadlineSeconds`` fail the Job and terminate the remaining pods; all indexes succeeded
  -> ``Complete``; delete with Background/Foreground propagation terminates and removes the pods.
- **Kubelet**: runs each pod's container ``command + args`` as a separate process group, with the
  environment a container would get (image ``PATH``, ``HOSTNAME=<job>-<i>``, ``envFrom`` Secrets,
  ``env`` including ``valueFrom.fieldRef``/``secretKeyRef``, and ``$(VAR)`` expansion of env values,
  command and args exactly like the kubelet: ``$$`` escapes, unknown references stay literal).
  ``emptyDir`` mounts become per-pod folders: env values under a mount (``HOME=/tmp``,
  ``XDG_CACHE_HOME=/cache``) are rewritten to the pod's folder; ``/dev/shm`` is a private tmpfs per
  pod (``unshare`` mount namespace, when the host allows it; see ``private_shm``), and
  the host filesystem plays the shared storage (paths in args and config files are not rewritten). Phase
  Pending -> Running -> Succeeded/Failed from the exit code (signal N -> exit code 128+N).
  Users, capabilities, resources, node selectors and images are NOT enforced (schema tests cover
  the manifests; a real cluster covers the rest).
- **Cluster DNS**: the launcher renders the real pod-0 name ``<job>-0.<service>.<ns>.svc`` (so the
  manifests are exactly what a cluster gets); the double resolves any ``<host>.<service>.<ns>.svc
  [.cluster.local]`` of a Service it holds to ``127.0.0.1`` when it builds the process's args and
  env - the job of CoreDNS. We chose this over a test-only "rdzv host" setting on the launcher
  (the production code stays free of test paths and the manifest under test is the real one) and
  over editing ``/etc/hosts`` (needs root, leaks out of the test). All "pods" share the loopback
  interface, so every torchrun agent sees a loopback endpoint and tries to host the c10d store;
  the first binds the port, the others fall back to clients (torch's own fallback).
"""

from __future__ import annotations

import base64
import copy
import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_CORE = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|services|secrets)(?:/(?P<name>[^/]+)(?:/(?P<sub>log|status))?)?$")
_BATCH = re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/(?P<res>jobs)(?:/(?P<name>[^/]+)(?:/(?P<sub>status))?)?$")
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubelet ``$(VAR)`` expansion: ``$$`` -> ``$``; undefined references are left as written."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, value)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


class _Pod:
    """One running "pod": its API object, its process group and its log file."""

    def __init__(self, obj: dict[str, Any], root: Path):
        self.obj = obj
        self.root = root
        self.log_path = root / "container.log"
        self.proc: subprocess.Popen | None = None
        self.done = threading.Event()
        self.deleting = False

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    def terminate(self, grace_s: float) -> None:
        self.deleting = True
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
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
        self._server: ThreadingHTTPServer | None = None
        self._rv = 0
        # Each pod gets its own /dev/shm (a tmpfs in a private mount namespace) when the host allows
        # it, as on a real node; mosaicml-streaming keys its shared memory by name in /dev/shm.
        self.private_shm = _private_shm_prefix() is not None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> KubeApiDouble:
        double = self

        class Handler(_Handler):
            api = double

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="kube-api-double", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig pointing at the double: the launcher loads it like any other cluster."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "double",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "double", "user": {"token": "test-double"}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "double", "namespace": namespace}}],
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
            return [p.name for p in self.pods.values() if p.proc is not None and p.proc.poll() is None]

    def kill_pod(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Chaos helper: signal a pod's whole process group (a node dying)."""
        with self.lock:
            pod = next(p for (ns, n), p in self.pods.items() if n == name)
        assert pod.proc is not None
        os.killpg(pod.proc.pid, sig)

    # -- REST -----------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any] | None,
               agent: str = ""):
        m = _CORE.match(path) or _BATCH.match(path)
        if not m:
            raise ApiError(404, "NotFound", f"the double does not serve {method} {path}")
        ns, res, name, sub = m["ns"], m["res"], m["name"], m["sub"]
        verb = {"POST": "create", "DELETE": "delete", "GET": "get" if name else "list"}.get(method)
        if verb is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} {path}")
        with self.lock:
            self.calls.append((verb, f"{res}/{sub}" if sub else res, agent))
        if res == "pods" and sub == "log":
            return ("log", ns, name, query)
        if verb == "create":
            return 201, self._create(res, ns, body or {})
        if verb == "delete":
            return 200, self._delete(res, ns, name, body or {})
        if verb == "get":
            return 200, self._get(res, ns, name)
        return 200, self._list(res, ns, query)

    def _create(self, res: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name is required")
        if meta.setdefault("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match the request")
        with self.lock:
            if (res, ns, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{res} "{name}" already exists')
            self._rv += 1
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion=str(self._rv))
            if res == "secrets":
                data = dict(obj.get("data") or {})
                for k, v in (obj.pop("stringData", None) or {}).items():
                    data[k] = base64.b64encode(v.encode()).decode()
                obj["data"] = data
            if res == "jobs":
                obj["status"] = {"startTime": _now(), "active": 0, "succeeded": 0, "failed": 0}
            self.objects[(res, ns, name)] = obj
        if res == "jobs":
            self._start_job(ns, obj)
        return obj

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
                items = [copy.deepcopy(o) for (r, ons, _), o in self.objects.items() if r == res and ons == ns]
        items = [o for o in items if _matches(o["metadata"].get("labels") or {}, labels)
                 and _matches({"metadata.name": o["metadata"]["name"]}, fields)]
        kind = {"pods": "PodList", "jobs": "JobList", "services": "ServiceList", "secrets": "SecretList"}[res]
        return {"kind": kind, "apiVersion": "batch/v1" if res == "jobs" else "v1",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def _delete(self, res: str, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if (res, ns, name) not in self.objects:
                raise ApiError(404, "NotFound", f'{res} "{name}" not found')
            obj = self.objects.pop((res, ns, name))
            pods = [p for (pns, _), p in self.pods.items()
                    if pns == ns and res == "jobs" and p.obj["metadata"]["labels"].get("job-name") == name]
        if res == "jobs" and body.get("propagationPolicy", "Background") != "Orphan":
            for pod in pods:
                pod.deleting = True
            threading.Thread(target=self._reap, args=(ns, pods), daemon=True).start()
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name, "kind": res},
                "metadata": {}} if obj else {}

    def _reap(self, ns: str, pods: list[_Pod]) -> None:
        for pod in pods:
            pod.terminate(self.grace_s)
            pod.done.wait(10)
            with self.lock:
                self.pods.pop((ns, pod.name), None)

    # -- Job controller -----------------------------------------------------------------------

    def _start_job(self, ns: str, job: dict[str, Any]) -> None:
        spec = job["spec"]
        if spec.get("completionMode") != "Indexed":
            raise ApiError(422, "Invalid", "the double only runs Indexed Jobs")
        n = min(int(spec.get("parallelism", 1)), int(spec.get("completions", 1)))
        name = job["metadata"]["name"]
        for i in range(n):
            self._create_pod(ns, job, i)
        deadline = spec.get("activeDeadlineSeconds")
        if deadline:
            def expire() -> None:
                if not self._job_finished(ns, name):
                    self._finish_job(ns, name, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
            timer = threading.Timer(float(deadline), expire)
            timer.daemon = True
            timer.start()

    def _create_pod(self, ns: str, job: dict[str, Any], index: int) -> None:
        job_name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        template = copy.deepcopy(job["spec"]["template"])
        meta = template.get("metadata") or {}
        pod_name = f"{job_name}-{index}-{uuid.uuid4().hex[:5]}"
        labels = {**(meta.get("labels") or {}), "job-name": job_name, "batch.kubernetes.io/job-name": job_name,
                  "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid, INDEX_KEY: str(index)}
        spec = template["spec"]
        spec["hostname"] = f"{job_name}-{index}"
        for c in spec["containers"]:
            env = c.setdefault("env", [])
            if not any(e["name"] == "JOB_COMPLETION_INDEX" for e in env):
                env.append({"name": "JOB_COMPLETION_INDEX",
                            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}})
        obj = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns, "uid": str(uuid.uuid4()), "labels": labels,
                         "annotations": {**(meta.get("annotations") or {}), INDEX_KEY: str(index)},
                         "creationTimestamp": _now(),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": uid,
                                              "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec,
            "status": {"phase": "Pending", "conditions": [], "containerStatuses": [
                {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
                 "started": False, "state": {"waiting": {"reason": "ContainerCreating"}}} for c in spec["containers"]]},
        }
        root = self.sandbox / pod_name
        root.mkdir(parents=True)
        pod = _Pod(obj, root)
        with self.lock:
            self.pods[(ns, pod_name)] = pod
            self.objects[("jobs", ns, job_name)]["status"]["active"] += 1
        threading.Thread(target=self._run_pod, args=(ns, job_name, pod), name=pod_name, daemon=True).start()

    def _run_pod(self, ns: str, job_name: str, pod: _Pod) -> None:
        container = pod.obj["spec"]["containers"][0]
        try:
            argv, env = self._container_process(ns, pod, container)
        except ApiError as e:  # e.g. a missing Secret: the kubelet keeps the pod waiting
            with self.lock:
                pod.obj["status"]["containerStatuses"][0]["state"] = {
                    "waiting": {"reason": "CreateContainerConfigError", "message": e.message}}
            pod.done.set()
            return
        with open(pod.log_path, "wb") as out:
            with self.lock:
                if pod.deleting:
                    pod.done.set()
                    return
                try:
                    pod.proc = subprocess.Popen(argv, env=env, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
                except OSError as e:  # like a runtime StartError: the container never ran
                    out.write(f"failed to start {argv[:1]}: {e}\n".encode())
                    pod.proc = subprocess.Popen(["false"], stdout=out, start_new_session=True)
                started = _now()
                pod.obj["status"].update(phase="Running", podIP="127.0.0.1", startTime=started)
                pod.obj["status"]["containerStatuses"][0].update(
                    ready=True, started=True, state={"running": {"startedAt": started}})
            rc = pod.proc.wait()
        code = 128 - rc if rc < 0 else rc  # killed by signal N -> 128 + N, as the container runtime reports
        with self.lock:
            pod.obj["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
            pod.obj["status"]["containerStatuses"][0].update(ready=False, started=False, state={"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "startedAt": pod.obj["status"].get("startTime"), "finishedAt": _now()}})
        pod.done.set()
        self._on_pod_finished(ns, job_name, pod, code)

    def _container_process(self, ns: str, pod: _Pod, c: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        mounts = {m["mountPath"]: pod.root / "volumes" / m["name"] for m in c.get("volumeMounts", [])
                  if m["mountPath"] != "/dev/shm" and self._is_empty_dir(pod, m["name"])}
        for path in mounts.values():
            path.mkdir(parents=True, exist_ok=True)
        env: dict[str, str] = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",  # the "image" PATH
            "LANG": "C.UTF-8",
            "HOSTNAME": pod.obj["spec"].get("hostname") or pod.name,
        }
        for src in c.get("envFrom", []):
            ref = src.get("secretRef")
            if ref is None:
                raise ApiError(422, "Invalid", "the double only supports envFrom secretRef")
            secret = self.objects.get(("secrets", ns, ref["name"]))
            if secret is None:
                if ref.get("optional"):
                    continue
                raise ApiError(404, "NotFound", f'secret "{ref["name"]}" not found')
            for k, v in (secret.get("data") or {}).items():
                env[(src.get("prefix") or "") + k] = base64.b64decode(v).decode()
        for e in c.get("env", []):
            if "valueFrom" in e:
                env[e["name"]] = self._value_from(ns, pod, e["valueFrom"])
            else:
                env[e["name"]] = expand(e.get("value", ""), env)
        argv = [expand(a, env) for a in [*c.get("command", []), *c.get("args", [])]]
        if self.private_shm and any(m["mountPath"] == "/dev/shm" for m in c.get("volumeMounts", [])):
            argv = [*_private_shm_prefix(), *argv]
        # Env values under an emptyDir mount (HOME=/tmp, XDG_CACHE_HOME=/cache, ...) point into the
        # pod's own folder; args and files are left alone: the host filesystem plays the shared
        # storage (the RWX volume / object store of a real cluster).
        # PATH is the "image's" (this venv), not a manifest value: never remapped, even when the
        # checkout itself lives under /tmp (as a CI clone may) and /tmp is an emptyDir in the pod.
        env = {k: self._dns(ns, v if k == "PATH" else self._remap(v, mounts)) for k, v in env.items()}
        return [self._dns(ns, a) for a in argv], env

    def _is_empty_dir(self, pod: _Pod, volume: str) -> bool:
        return any(v["name"] == volume and "emptyDir" in v for v in pod.obj["spec"].get("volumes", []))

    @staticmethod
    def _remap(value: str, mounts: dict[str, Path]) -> str:
        for mount, local in mounts.items():
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount):]
        return value

    def _dns(self, ns: str, value: str) -> str:
        with self.lock:
            services = {(n, s) for (r, s, n) in self.objects if r == "services"}

        def resolve(m: re.Match) -> str:
            return "127.0.0.1" if (m["svc"], m["ns"]) in services else m.group(0)

        return re.sub(r"[a-z0-9-]+\.(?P<svc>[a-z0-9-]+)\.(?P<ns>[a-z0-9-]+)\.svc(?:\.cluster\.local)?", resolve, value)

    def _value_from(self, ns: str, pod: _Pod, src: dict[str, Any]) -> str:
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            meta = pod.obj["metadata"]
            m = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
            if m:
                return (meta.get(m[1]) or {}).get(m[2], "")
            return {"metadata.name": meta["name"], "metadata.namespace": ns, "status.podIP": "127.0.0.1"}[path]
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            secret = self.objects.get(("secrets", ns, ref["name"]))
            if secret is None or ref["key"] not in (secret.get("data") or {}):
                raise ApiError(404, "NotFound", f'secret "{ref["name"]}" key "{ref["key"]}" not found')
            return base64.b64decode(secret["data"][ref["key"]]).decode()
        raise ApiError(422, "Invalid", f"the double does not support valueFrom {sorted(src)}")

    def _job_finished(self, ns: str, name: str) -> bool:
        with self.lock:
            job = self.objects.get(("jobs", ns, name))
            return job is None or any(c["type"] in ("Complete", "Failed") for c in job["status"].get("conditions", []))

    def _on_pod_finished(self, ns: str, job_name: str, pod: _Pod, code: int) -> None:
        with self.lock:
            job = self.objects.get(("jobs", ns, job_name))
            if job is None or pod.deleting or self._job_finished(ns, job_name):
                return
            status, spec = job["status"], job["spec"]
            status["active"] -= 1
            if code == 0:
                status["succeeded"] += 1
                if status["succeeded"] >= int(spec.get("completions", 1)):
                    self._set_condition(job, "Complete", "CompletionsReached", "Reached expected number of succeeded pods")
                    status["completionTime"] = _now()
                return
            status["failed"] += 1
            reason = None
            for rule in (spec.get("podFailurePolicy") or {}).get("rules", []):
                codes = rule.get("onExitCodes")
                if rule.get("action") == "FailJob" and codes and (
                        (codes["operator"] == "In") == (code in codes["values"])):
                    reason, message = "PodFailurePolicy", f"Container {pod.obj['spec']['containers'][0]['name']} for pod {ns}/{pod.name} failed with exit code {code} matching FailJob rule"
                    break
            if reason is None and status["failed"] > int(spec.get("backoffLimit", 6)):
                reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
            if reason is None:
                return  # the double never re-creates failed pods (launcher Jobs use backoffLimit 0)
        self._finish_job(ns, job_name, "Failed", reason, message)

    def _finish_job(self, ns: str, name: str, ctype: str, reason: str, message: str) -> None:
        with self.lock:
            job = self.objects.get(("jobs", ns, name))
            if job is None:
                return
            if ctype == "Failed":
                self._set_condition(job, "FailureTarget", reason, message)
            self._set_condition(job, ctype, reason, message)
            peers = [p for (pns, _), p in self.pods.items()
                     if pns == ns and p.obj["metadata"]["labels"].get("job-name") == name and not p.done.is_set()]
        for pod in peers:  # the controller terminates the remaining pods of a failed Job
            threading.Thread(target=pod.terminate, args=(self.grace_s,), daemon=True).start()

    @staticmethod
    def _set_condition(job: dict[str, Any], ctype: str, reason: str, message: str) -> None:
        job["status"].setdefault("conditions", []).append({
            "type": ctype, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": _now(), "lastTransitionTime": _now()})

    # -- logs -----------------------------------------------------------------------------------

    def pod_for_logs(self, ns: str, name: str) -> _Pod:
        with self.lock:
            pod = self.pods.get((ns, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        if pod.proc is None:
            raise ApiError(400, "BadRequest", f'container in pod "{name}" is waiting to start: ContainerCreating')
        return pod


_SHM_PROBE: list[str] | None | bool = False


def _private_shm_prefix() -> list[str] | None:
    """``unshare`` + tmpfs on /dev/shm for a command, if this host permits it (root or user namespaces)."""
    global _SHM_PROBE
    if _SHM_PROBE is False:
        _SHM_PROBE = None
        if shutil.which("unshare"):
            mount = 'mount -t tmpfs -o size=1g tmpfs /dev/shm && exec "$0" "$@"'
            for flags in (["--mount", "--propagation", "private"], ["--user", "--map-root-user", "--mount"]):
                prefix = ["unshare", *flags, "sh", "-c", mount]
                ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
                if ok:
                    _SHM_PROBE = prefix
                    break
    return _SHM_PROBE  # type: ignore[return-value]


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
        if (op == "=" and have != val) or (op == "!=" and have == val) or (op == "exists" and have is None) \
                or (op == "!" and have is not None):
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    api: KubeApiDouble
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send_json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, method: str) -> None:
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        try:
            result = self.api.handle(method, url.path, parse_qs(url.query), body, self.headers.get("User-Agent", ""))
            if result[0] == "log":
                _, ns, name, query = result
                self._logs(self.api.pod_for_logs(ns, name), query)
                return
            self._send_json(*result)
        except ApiError as e:
            self._send_json(e.code, e.body())

    do_GET = lambda self: self._dispatch("GET")  # noqa: E731
    do_POST = lambda self: self._dispatch("POST")  # noqa: E731
    do_DELETE = lambda self: self._dispatch("DELETE")  # noqa: E731

    def _logs(self, pod: _Pod, query: dict[str, list[str]]) -> None:
        follow = query.get("follow", ["false"])[0].lower() == "true"
        tail = query.get("tailLines", [None])[0]
        if not follow:
            lines = pod.log_path.read_bytes().splitlines(keepends=True)
            data = b"".join(lines[-int(tail):] if tail else lines)
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
            with open(pod.log_path, "rb") as f:
                while True:
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
