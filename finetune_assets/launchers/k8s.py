"""Run the training command as multi-node torchrun pods on Kubernetes (an Indexed Job + headless Service).

Why the ``execute_k8s_job`` machinery and not ``PipesK8sClient``
------------------------------------------------------------------
``PipesK8sClient`` starts one bare Pod per call. A multi-node torchrun run is a *gang*: N pods that
must start together, find each other, and live and die together. A Kubernetes Job gives that for
free and server-side: ``completionMode: Indexed`` numbers the pods (``JOB_COMPLETION_INDEX`` and
stable hostnames ``<job>-<i>``), ``backoffLimit: 0`` + a ``podFailurePolicy`` make the controller
fail the whole Job and kill the peers when one node dies, ``activeDeadlineSeconds`` bounds it, and
``ttlSecondsAfterFinished`` garbage-collects it even if this process disappears. With Pipes we would
re-implement all of that client-side with bare pods, and the trainer would have to speak
``dagster-pipes``; by design it is a Dagster-free module that reports through storage and MLflow.

So we build on the pieces under ``dagster_k8s.execute_k8s_job``: ``construct_dagster_k8s_job``
(Dagster's Job manifest builder: common labels, label sanitizing, snake/camel model conversion),
``DagsterKubernetesClient`` (API handles, pod log retrieval) and its retrying helpers. We do *not*
call ``execute_k8s_job`` itself: it creates no Service, streams logs from whichever pod lists first
(not rank 0), and with ``parallelism > 1`` waits until no pod is active, so one dead rank with hung
peers would hang until the timeout. Here the supervision loop streams the index-0 pod, fails as soon
as any pod fails (copying the failed pods' log tails into the Dagster log and the error), and always
deletes the Job and the Service (success, failure, timeout, interruption).

Security: pods run non-root with a read-only root filesystem (writable emptyDirs for ``/tmp``,
caches and ``/dev/shm``), no privilege escalation, all capabilities dropped, the RuntimeDefault
seccomp profile, no service-account token, and resource limits. Credentials reach the pods only as
``envFrom`` references to Kubernetes Secrets by *name*; this process never reads or renders their
values, and plain ``env`` entries that look like credentials are refused.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import dagster as dg
import kubernetes
import yaml
from pydantic import Field

from finetune_assets.launchers.base import (
    TRAINER_MODULE,
    TrainingFailed,
    TrainingJob,
    TrainingLauncher,
    torchrun_command,
)

CONTAINER_NAME = "trainer"
# Our own pod label: the Service selector and every pod query use it (the controller's `job-name`
# label is not set by every Job implementation, e.g. older clusters or API doubles).
JOB_LABEL = "finetune-assets/training-job"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
COMPONENT = "finetune-trainer"
# Environment names that must come from a Kubernetes Secret, never from a plain `env` value.
_SECRET_ENV = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL|API_KEY)", re.I)
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Waiting reasons that will not fix themselves while we wait (CreateContainerConfigError: usually a
# missing Secret named in env_secret_names).
_FATAL_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}
# Writable scratch volumes under the read-only root filesystem.
SCRATCH_MOUNTS = {"tmp": "/tmp", "cache": "/cache"}
POD_ENV = {
    "PYTHONUNBUFFERED": "1",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "XDG_CACHE_HOME": "/cache",
    "HF_HOME": "/cache/huggingface",
    "TORCH_HOME": "/cache/torch",
    "TRITON_CACHE_DIR": "/cache/triton",
    "MPLCONFIGDIR": "/cache/matplotlib",
}


class PullPolicy(str, Enum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class TolerationOperator(str, Enum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class TaintEffect(str, Enum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class PropagationPolicy(str, Enum):
    BACKGROUND = "Background"
    FOREGROUND = "Foreground"


class Toleration(dg.Config):
    """One pod toleration (e.g. for tainted GPU nodes: key ``nvidia.com/gpu``, operator ``Exists``)."""

    key: str | None = None
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str | None = None
    effect: TaintEffect | None = None
    toleration_seconds: int | None = None

    def to_k8s(self) -> dict[str, Any]:
        out = {
            "key": self.key,
            "operator": TolerationOperator(self.operator).value,
            "value": self.value,
            "effect": TaintEffect(self.effect).value if self.effect else None,
            "tolerationSeconds": self.toleration_seconds,
        }
        return {k: v for k, v in out.items() if v is not None}


def k8s_name(base: str, *, max_len: int = 40) -> str:
    """A DNS-1123 label from ``base`` plus a random suffix (a retried run never collides).

    ``max_len`` leaves room for the pod hostname ``<name>-<index>`` and the generated pod names.
    """
    stem = _DNS_LABEL.sub("-", base.lower()).strip("-")[:max_len].strip("-") or "train"
    if not stem[0].isalpha():
        stem = "t-" + stem[: max_len - 2]
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def sanitize_label_value(value: str) -> str:
    """A valid label value: at most 63 chars of ``[A-Za-z0-9._-]``, alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9._-]", "-", str(value))[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _check_plain_env(env: Mapping[str, str], where: str) -> None:
    for key in env:
        if _SECRET_ENV.search(key):
            raise ValueError(
                f"{where}: {key!r} looks like a credential; put it in a Kubernetes Secret and list the "
                "Secret's name in env_secret_names instead of passing its value"
            )


class K8sTorchrunLauncher(TrainingLauncher):
    """Runs the torchrun command as ``nnodes`` pods of an Indexed Job with c10d rendezvous on pod 0."""

    image: str = Field(description="Image with this package installed (see deploy/Dockerfile).")
    namespace: str = Field(default="default", description="Namespace of the Job, Service and pods.")
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    image_pull_secrets: list[str] = Field(default_factory=list)
    nnodes: int = Field(default=1, ge=1, description="Pods (torchrun nodes); each runs nproc_per_node workers.")
    gpus_per_node: int = Field(default=0, ge=0, description="nvidia.com/gpu per pod (usually = nproc_per_node).")
    cpu_request: str = "1"
    cpu_limit: str | None = "4"
    memory_request: str = "4Gi"
    memory_limit: str | None = "8Gi"
    shm_size: str = Field(default="1Gi", description="Size of the memory-backed /dev/shm (DataLoader, NCCL, streaming).")
    scratch_size: str = Field(default="8Gi", description="Size limit of each writable emptyDir (/tmp, /cache).")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="Extra non-secret environment for the pods.")
    env_secret_names: list[str] = Field(
        default_factory=list,
        description="Kubernetes Secrets whose keys become environment variables (envFrom): storage and MLflow credentials.",
    )
    service_account_name: str | None = Field(default=None, description="SA of the training pods (needs no RBAC).")
    storage_pvc_name: str | None = Field(
        default=None, description="A ReadWriteMany PVC to mount as the shared storage root (instead of s3://)."
    )
    storage_mount_path: str = Field(default="/data", description="Where storage_pvc_name is mounted in the pods.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on the Job, Service and pods.")
    rdzv_port: int = Field(default=29400, ge=1, le=65535)
    timeout_s: int = Field(default=24 * 3600, ge=1, description="Wall-clock limit (also the Job's activeDeadlineSeconds).")
    ttl_seconds_after_finished: int = Field(default=3600, ge=0)
    delete_propagation_policy: PropagationPolicy = PropagationPolicy.BACKGROUND
    run_as_user: int = Field(default=1000, ge=1)
    read_only_root_filesystem: bool = True
    python: str = Field(default="python", description="The interpreter inside the image.")
    trainer_module: str = Field(default=TRAINER_MODULE, description="Module torchrun runs (tests use a stand-in).")
    load_incluster_config: bool = Field(default=True, description="True inside the cluster (run pods); else kubeconfig.")
    kubeconfig_file: str | None = Field(default=None, description="Kubeconfig path; None = $KUBECONFIG or ~/.kube/config.")
    kube_context: str | None = None
    poll_interval_s: float = Field(default=2.0, gt=0)
    log_tail_lines: int = Field(default=100, ge=1)

    # -- rendering ----------------------------------------------------------------------------

    def rdzv_host(self, name: str) -> str:
        """Pod 0's DNS name through the headless Service (``<job>-0.<service>.<ns>.svc``)."""
        return f"{name}-0.{name}.{self.namespace}.svc"

    def command(self, job: TrainingJob, name: str) -> list[str]:
        """The container command: the same torchrun command as the local launcher, per node."""
        if self.nnodes == 1:
            return torchrun_command(
                job.config_url, nproc_per_node=self.nproc_per_node, max_restarts=self.max_restarts,
                python=self.python, module=self.trainer_module,
            )
        return torchrun_command(
            job.config_url,
            nproc_per_node=self.nproc_per_node,
            nnodes=self.nnodes,
            max_restarts=self.max_restarts,
            node_rank="$(JOB_COMPLETION_INDEX)",  # expanded by the kubelet from the pod's env
            rdzv_endpoint=f"{self.rdzv_host(name)}:{self.rdzv_port}",
            rdzv_id=name,  # unique per launch: torchrun's default id is shared by every run
            python=self.python,
            module=self.trainer_module,
        )

    def _labels(self, job: TrainingJob, name: str) -> dict[str, str]:
        labels = {**self.labels, **job.labels}
        for key in labels:
            if not _LABEL_KEY.match(key):
                raise ValueError(f"invalid Kubernetes label key {key!r}")
        out = {k: sanitize_label_value(v) for k, v in labels.items()}
        out[JOB_LABEL] = name
        return out

    def _env(self, job: TrainingJob) -> list[dict[str, Any]]:
        _check_plain_env(self.env, "K8sTorchrunLauncher.env")
        _check_plain_env(job.env, "TrainingJob.env")
        merged = {**POD_ENV, **self.env, **job.env}
        # JOB_COMPLETION_INDEX is added to every container by the Job controller (Indexed mode).
        env = [{"name": k, "value": str(v)} for k, v in merged.items()]
        return env

    def _resources(self) -> dict[str, Any]:
        requests = {"cpu": self.cpu_request, "memory": self.memory_request}
        limits: dict[str, str] = {}
        if self.cpu_limit:
            limits["cpu"] = self.cpu_limit
        if self.memory_limit:
            limits["memory"] = self.memory_limit
        if self.gpus_per_node:
            requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(self.gpus_per_node)
        return {"requests": requests, "limits": limits}

    def render(self, job: TrainingJob, name: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The Service (None for one node) and the Job as API-ready dicts (camelCase, no secrets)."""
        from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

        labels = self._labels(job, name)
        volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": self.shm_size}}]
        volumes += [{"name": v, "emptyDir": {"sizeLimit": self.scratch_size}} for v in SCRATCH_MOUNTS]
        mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
        mounts += [{"name": v, "mountPath": p} for v, p in SCRATCH_MOUNTS.items()]
        if self.storage_pvc_name:
            volumes.append({"name": "storage", "persistentVolumeClaim": {"claimName": self.storage_pvc_name}})
            mounts.append({"name": "storage", "mountPath": self.storage_mount_path})
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",  # torchrun restarts workers; a dead node fails the Job
            "automountServiceAccountToken": False,  # the trainer never calls the Kubernetes API
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 30,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": self.run_as_user,
                "runAsGroup": self.run_as_user,
                "fsGroup": self.run_as_user,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumes": volumes,
        }
        if self.nnodes > 1:
            pod_spec["subdomain"] = name  # hostname <job>-<i> + subdomain = DNS record via the Service
        if self.node_selector:
            pod_spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            pod_spec["tolerations"] = [t.to_k8s() for t in self.tolerations]
        if self.image_pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": s} for s in self.image_pull_secrets]
        container = {
            "name": CONTAINER_NAME,
            "command": self.command(job, name),
            "env": self._env(job),
            "volumeMounts": mounts,
            "resources": self._resources(),
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": self.read_only_root_filesystem,
                "runAsNonRoot": True,
                "capabilities": {"drop": ["ALL"]},
            },
        }
        if self.nnodes > 1:
            container["ports"] = [{"name": "c10d", "containerPort": self.rdzv_port, "protocol": "TCP"}]
        job_spec = {
            "completionMode": "Indexed",
            "completions": self.nnodes,
            "parallelism": self.nnodes,
            "backoffLimit": 0,
            # Any non-zero exit fails the whole Job at once (the controller then kills the peers).
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "NotIn", "values": [0]}},
            ]},
            "activeDeadlineSeconds": self.timeout_s,
            "ttlSecondsAfterFinished": self.ttl_seconds_after_finished,
        }
        manifest = construct_dagster_k8s_job(
            job_config=DagsterK8sJobConfig(
                job_image=self.image,
                image_pull_policy=PullPolicy(self.image_pull_policy).value,
                service_account_name=self.service_account_name,
                env_secrets=list(self.env_secret_names),  # envFrom secretRef, by name only
            ),
            args=None,
            job_name=name,
            pod_name=name,
            component=COMPONENT,
            labels=labels,
            user_defined_k8s_config=UserDefinedDagsterK8sConfig.from_dict({
                "container_config": container,
                "pod_spec_config": pod_spec,
                "job_spec_config": job_spec,
                "job_metadata": {"namespace": self.namespace},
            }),
        )
        job_dict = kubernetes.client.ApiClient().sanitize_for_serialization(manifest)
        # The Job controller adds the completion index to each pod; the template may not name pods.
        job_dict["spec"]["template"]["metadata"].pop("name", None)
        service = None
        if self.nnodes > 1:
            service = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": self.namespace, "labels": job_dict["metadata"]["labels"]},
                "spec": {
                    "clusterIP": "None",  # headless: DNS answers with the pod IPs
                    "publishNotReadyAddresses": True,  # pod 0 resolvable before it is "ready"
                    "selector": {JOB_LABEL: name},
                    "ports": [{"name": "c10d", "port": self.rdzv_port, "targetPort": self.rdzv_port, "protocol": "TCP"}],
                },
            }
        return service, job_dict

    # -- the API ------------------------------------------------------------------------------

    def api(self):
        """A ``DagsterKubernetesClient`` on a private client configuration (no global state)."""
        from dagster_k8s.client import DagsterKubernetesClient, PatchedApiClient

        configuration = kubernetes.client.Configuration()
        if self.load_incluster_config:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(
                config_file=self.kubeconfig_file, context=self.kube_context, client_configuration=configuration
            )
        api_client = PatchedApiClient(configuration=configuration)
        return DagsterKubernetesClient.production_client(
            batch_api_override=kubernetes.client.BatchV1Api(api_client),
            core_api_override=kubernetes.client.CoreV1Api(api_client),
        )

    # -- launching ----------------------------------------------------------------------------

    def launch(self, context: dg.AssetExecutionContext, job: TrainingJob) -> None:
        from dagster_k8s.client import k8s_api_retry_creation_mutation

        log = context.log
        name = k8s_name(job.name)
        service, manifest = self.render(job, name)
        log.info(
            f"Launching training Job {self.namespace}/{name}: {self.nnodes} pod(s) x {self.nproc_per_node} "
            f"process(es), image {self.image}, command: {' '.join(self.command(job, name))}"
        )
        # Names of Secrets only; the manifest carries no secret values by construction.
        log.debug("Rendered manifests:\n" + yaml.safe_dump_all([m for m in (service, manifest) if m], sort_keys=False))
        api = self.api()
        ns = self.namespace
        follower: _LogFollower | None = None
        try:
            if service is not None:
                k8s_api_retry_creation_mutation(
                    lambda: api.core_api.create_namespaced_service(ns, service), max_retries=3, timeout=1.0
                )
            k8s_api_retry_creation_mutation(
                lambda: api.batch_api.create_namespaced_job(ns, manifest), max_retries=3, timeout=1.0
            )
            follower = _LogFollower(api, ns)
            self._supervise(log, api, name, follower)
        finally:
            # Delete first: whatever interrupted us (failure, timeout, run termination) must not keep
            # the pods alive. Deleting the pods also ends the follow stream of the log thread.
            self._cleanup(log, api, name, service is not None)
            if follower is not None:
                follower.stop()
                follower.drain(log)  # pod 0's last lines before the failure or interruption

    def _supervise(self, log, api, name: str, follower: _LogFollower) -> None:
        ns = self.namespace
        deadline = time.monotonic() + self.timeout_s
        selector = f"{JOB_LABEL}={name}"
        while True:
            follower.drain(log)
            pods = api.core_api.list_namespaced_pod(ns, label_selector=selector).items
            by_index = {_completion_index(p): p for p in pods}
            pod0 = by_index.get(0)
            if pod0 is not None and pod0.status and pod0.status.phase in ("Running", "Succeeded", "Failed"):
                follower.start(pod0.metadata.name)
            status = api.batch_api.read_namespaced_job(name, ns).status
            conditions = {c.type: c for c in (status.conditions or []) if c.status == "True"} if status else {}
            failed_cond = conditions.get("Failed") or conditions.get("FailureTarget")
            if failed_cond is not None and failed_cond.reason == "DeadlineExceeded":
                self._fail(log, api, name, pods, f"timed out after {self.timeout_s}s (activeDeadlineSeconds)")
            failed = [p for p in pods if p.status and p.status.phase == "Failed"]
            if failed:  # fail fast: do not wait for the Job controller or for hung peers
                self._fail(log, api, name, failed, "pod(s) failed")
            if failed_cond is not None:
                self._fail(log, api, name, pods, f"Job failed: {failed_cond.reason}: {failed_cond.message}")
            stuck = [(p, r) for p in pods if (r := _fatal_waiting_reason(p))]
            if stuck:
                detail = "; ".join(f"{p.metadata.name}: {r}" for p, r in stuck)
                raise TrainingFailed(f"training Job {ns}/{name} cannot start its pods: {detail}")
            if "Complete" in conditions or (status and (status.succeeded or 0) >= self.nnodes):
                follower.start(pod0.metadata.name if pod0 is not None else None)
                follower.wait(timeout=30)
                follower.drain(log)
                log.info(f"Training Job {ns}/{name}: all {self.nnodes} pod(s) succeeded")
                return
            if time.monotonic() > deadline:
                self._fail(log, api, name, pods, f"timed out after {self.timeout_s}s")
            time.sleep(self.poll_interval_s)

    def _fail(self, log, api, name: str, pods: Sequence[Any], why: str) -> None:
        """Copy the relevant pods' log tails into the Dagster log and raise :class:`TrainingFailed`."""
        parts = []
        for pod in sorted(pods, key=_completion_index):
            tail = _safe_logs(api, pod.metadata.name, self.namespace, self.log_tail_lines)
            state = _pod_state(pod)
            log.error(f"Pod {pod.metadata.name} (node {_completion_index(pod)}) {state}; last log lines:\n{tail}")
            parts.append(f"--- pod {pod.metadata.name} (node {_completion_index(pod)}) {state} ---\n{tail}")
        raise TrainingFailed(f"training Job {self.namespace}/{name}: {why}\n" + "\n".join(parts))

    def _cleanup(self, log, api, name: str, has_service: bool) -> None:
        ns = self.namespace
        body = kubernetes.client.V1DeleteOptions(propagation_policy=PropagationPolicy(self.delete_propagation_policy).value)
        deletions = [("Job", lambda: api.batch_api.delete_namespaced_job(name, ns, body=body))]
        if has_service:
            deletions.append(("Service", lambda: api.core_api.delete_namespaced_service(name, ns)))
        for kind, delete in deletions:
            try:
                delete()
                log.info(f"Deleted {kind} {ns}/{name}")
            except kubernetes.client.ApiException as e:
                if e.status != 404:
                    log.warning(f"Could not delete {kind} {ns}/{name} ({e.status} {e.reason}); its TTL will")
            except Exception as e:  # never mask the training outcome with a cleanup error
                log.warning(f"Could not delete {kind} {ns}/{name}: {e!r}")


# -- helpers --------------------------------------------------------------------------------------


def _completion_index(pod) -> int:
    meta = pod.metadata
    raw = (meta.annotations or {}).get(COMPLETION_INDEX_ANNOTATION) or (meta.labels or {}).get(COMPLETION_INDEX_ANNOTATION)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return -1


def _fatal_waiting_reason(pod) -> str | None:
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in _FATAL_WAITING:
            return f"{waiting.reason}: {waiting.message or ''}".strip()
    return None


def _pod_state(pod) -> str:
    phase = pod.status.phase if pod.status else "Unknown"
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        term = cs.state.terminated if cs.state else None
        if term is not None:
            return f"{phase}, exit code {term.exit_code} ({term.reason or 'no reason'})"
    return phase


def _safe_logs(api, pod_name: str, namespace: str, tail_lines: int) -> str:
    try:
        return api.retrieve_pod_logs(pod_name, namespace, container_name=CONTAINER_NAME, tail_lines=tail_lines)
    except Exception as e:
        return f"<logs unavailable: {e!r}>"


class _LogFollower:
    """Follows one pod's log on a background thread; the caller drains lines into ``context.log``.

    Lines go through a queue so that only the launching thread touches the Dagster logger.
    """

    def __init__(self, api, namespace: str):
        self._api = api
        self._ns = namespace
        self._lines: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.pod: str | None = None

    def start(self, pod: str | None) -> None:
        if self._thread is not None or pod is None:
            return
        self.pod = pod
        self._thread = threading.Thread(target=self._run, name=f"logs-{pod}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buf = b""
        for _attempt in range(30):
            if self._stop.is_set():
                return
            try:
                response = self._api.core_api.read_namespaced_pod_log(
                    self.pod, self._ns, container=CONTAINER_NAME, follow=True, _preload_content=False
                )
                for chunk in response.stream(4096):
                    if self._stop.is_set():
                        return
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        self._lines.put(line.decode("utf-8", "replace"))
                if buf:
                    self._lines.put(buf.decode("utf-8", "replace"))
                return
            except kubernetes.client.ApiException as e:
                if e.status != 400:  # 400: container not started yet
                    self._lines.put(f"<log stream of {self.pod} ended: {e.status} {e.reason}>")
                    return
                time.sleep(1.0)
            except Exception as e:
                if not self._stop.is_set():
                    self._lines.put(f"<log stream of {self.pod} ended: {e!r}>")
                return

    def drain(self, log) -> None:
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            log.info(f"[{self.pod}] {line}")

    def wait(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> None:
        """Stop following; the daemon thread ends when the (deleted) pod's log stream closes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
