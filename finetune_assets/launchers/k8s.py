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
as any pod fails (copying every pod's log tail and the Warning Events into the Dagster log and the
error), says why pods wait (scheduler, quota/admission, image pulls) and bounds that wait, resubmits a
fresh gang that resumes from the checkpoint when a pod is disrupted (``DisruptionTarget``: eviction,
preemption, node lost), and always deletes the Job and the Service (success, failure, timeout,
interruption). Owner references (launching pod -> Job -> Service) let Kubernetes delete the gang when
this process dies with its pod; the next attempt deletes any live gang of the same asset + partition.
Pod 0 hosts the c10d store unconditionally (:func:`pod0_hosts_the_store`).

Security: pods run non-root with a read-only root filesystem (writable emptyDirs for ``/tmp``,
caches and ``/dev/shm``), no privilege escalation, all capabilities dropped, the RuntimeDefault
seccomp profile, no service-account token, and resource limits. Credentials reach the pods only as
``envFrom`` references to Kubernetes Secrets by *name*; this process never reads or renders their
values, and plain ``env`` entries that look like credentials are refused.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import dagster as dg
import kubernetes
import yaml
from pydantic import Field

from finetune_assets.launchers.base import (
    TRAINER_MODULE,
    TrainingFailed,
    TrainingSpec,
    TrainingLauncher,
    log_trainer_line,
    torchrun_command,
)

CONTAINER_NAME = "trainer"
# Our own pod label: the Service selector and every pod query use it (the controller's `job-name`
# label is not set by every Job implementation, e.g. older clusters or API doubles).
JOB_LABEL = "finetune-assets/training-job"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
COMPONENT = "finetune-trainer"
# One value per asset + partition on every Job: finds a live gang left by a dead launcher (see gang_key).
GANG_LABEL = "finetune-assets/gang"
EVENTS_EVERY_S = 5.0
API_TIMEOUT_S = 30  # every API read is bounded: a hung connection must not hang the supervision loop
GONE_TIMEOUT_S = 120  # a deleted gang's pods: terminationGracePeriodSeconds (30) plus slack
# Environment names that must come from a Kubernetes Secret, never from a plain `env` value
# (TOKENIZERS_PARALLELISM, which the data fan-out sets on every worker, is a switch, not a token).
_SECRET_ENV = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN(?!IZER)|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL|API_KEY)", re.I)
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
    # A replaced pod's torchrun agent cannot rejoin the rendezvous' shared TCP store in torch 2.x (it waits
    # for a MASTER_ADDR the node-0 agent never republishes): give each round its own store instead.
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
}


# Resource sizing per process when a field is "auto" (an 8-GPU pod gets 8x, /dev/shm on top of memory).
AUTO = "auto"
CPU_PER_PROCESS = 1
CPU_LIMIT_PER_PROCESS = 4
MEM_PER_PROCESS_GI = 4
MEM_LIMIT_PER_PROCESS_GI = 8
MEM_HEADROOM_PER_PROCESS_GI = 1  # the least a limit must leave per process beside /dev/shm
SHM_PER_GPU_GI = 2


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


def pod0_hosts_the_store(cmd: list[str], port: int) -> list[str]:
    """Wrap a multi-node torchrun command so that pod 0 always hosts the c10d store (TorchX does the same).

    torchrun hosts the store only when the endpoint resolves to its own address; while cluster DNS lags
    behind a new pod nobody would host it and every pod fails. Pod 0 is given ``localhost`` (always its
    own), the others pod 0's DNS name; one pod template serves every index, hence the ``sh`` test on
    ``JOB_COMPLETION_INDEX`` (``exec``: no shell stays behind). Rank 0 lands on pod 0 because c10d
    orders nodes by address and ``<job>-0.`` sorts before every ``<job>-<i>.``.
    """
    i = cmd.index("--rdzv-endpoint")
    endpoint = cmd[i + 1]
    rest = cmd[:i] + cmd[i + 2:]
    if rest[1:3] != ["-m", "torch.distributed.run"]:
        raise ValueError(f"not a torchrun command: {cmd[:3]}")
    script = (
        f'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then e=localhost:{port}; else e={endpoint}; fi; '
        'shift 2; exec "$0" -m torch.distributed.run --rdzv-endpoint "$e" "$@"'
    )
    return ["sh", "-c", script, *rest]


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

    image: str | None = Field(
        default=None, description="Image with this package installed (deploy/Dockerfile). Unset: the launching pod's "
        "own image (in-cluster), so the Helm values name the image once.")
    namespace: str = Field(default="default", description="Namespace of the Job, Service and pods.")
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    image_pull_secrets: list[str] = Field(default_factory=list)
    nnodes: int = Field(default=1, ge=1, description="Pods (torchrun nodes); each runs nproc_per_node workers.")
    gpus_per_node: int = Field(default=0, ge=0, description="nvidia.com/gpu per pod; processes per pod follow it.")
    nproc_per_node: int | None = Field(  # type: ignore[assignment]
        default=None, ge=1, description="Processes per pod; unset = gpus_per_node (one per GPU), or 1 without GPUs.")
    # "auto" = sized from the processes per pod (see `sizing`); None = no limit.
    cpu_request: str = Field(default=AUTO, description=f"'auto' = {CPU_PER_PROCESS} core(s) per process.")
    cpu_limit: str | None = Field(default=AUTO, description=f"'auto' = {CPU_LIMIT_PER_PROCESS} cores per process; None = no limit.")
    memory_request: str = Field(default=AUTO, description=f"'auto' = {MEM_PER_PROCESS_GI}Gi per process + /dev/shm.")
    memory_limit: str | None = Field(
        default=AUTO, description=f"'auto' = {MEM_LIMIT_PER_PROCESS_GI}Gi per process + /dev/shm; None = no limit.")
    shm_size: str = Field(
        default=AUTO, description="Memory-backed /dev/shm (DataLoader, NCCL, streaming); counts against the memory "
        f"limit. 'auto' = {SHM_PER_GPU_GI}Gi per GPU process, else 1Gi.")
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
    rdzv_timeout_s: int = Field(
        default=900, ge=1,
        description="c10d rendezvous join and read timeout: longer than the worst gap between the first and the last "
        "pod starting (GPU node scale-up, a multi-GB image pull). torchrun's own default read timeout is 60 s.",
    )
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
    start_timeout_s: int = Field(
        default=1800, ge=1, description="How long pods may stay Pending (scheduling, node scale-up, image pull, quota) "
        "before the launch fails with the scheduler's / admission's reason.")
    max_resubmissions: int = Field(
        default=3, ge=0, description="Fresh gangs after a disruption (eviction, preemption, node lost); each resumes "
        "from the last checkpoint. Failures of the training code itself are never resubmitted.")
    owner_pod: str | None = Field(
        default=None, description="Pod that owns the training Job, so Kubernetes deletes the gang when it dies. "
        "Unset: in-cluster this pod ($HOSTNAME), outside none.")
    log_tail_lines: int = Field(default=100, ge=1)

    # -- rendering ----------------------------------------------------------------------------

    def rdzv_host(self, name: str) -> str:
        """Pod 0's DNS name through the headless Service (``<job>-0.<service>.<ns>.svc``)."""
        return f"{name}-0.{name}.{self.namespace}.svc"

    def command(self, job: TrainingSpec, name: str) -> list[str]:
        """The container command: the same torchrun command as the local launcher, per node."""
        if self.nnodes == 1:
            return torchrun_command(
                job.config_url, nproc_per_node=self.processes, max_restarts=self.max_restarts,
                python=self.python, module=self.trainer_module,
            )
        cmd = torchrun_command(
            job.config_url,
            nproc_per_node=self.processes,
            nnodes=self.nnodes,
            max_restarts=self.max_restarts,
            node_rank="$(JOB_COMPLETION_INDEX)",  # expanded by the kubelet from the pod's env
            rdzv_endpoint=f"{self.rdzv_host(name)}:{self.rdzv_port}",
            rdzv_id=name,  # unique per launch: torchrun's default id is shared by every run
            rdzv_conf={"join_timeout": self.rdzv_timeout_s, "read_timeout": self.rdzv_timeout_s},
            python=self.python,
            module=self.trainer_module,
        )
        return pod0_hosts_the_store(cmd, self.rdzv_port)

    def _labels(self, extra: Mapping[str, str], name: str, gang: str | None) -> dict[str, str]:
        labels = {**self.labels, **extra}
        for key in labels:
            if not _LABEL_KEY.match(key):
                raise ValueError(f"invalid Kubernetes label key {key!r}")
        out = {k: sanitize_label_value(v) for k, v in labels.items()}
        out[JOB_LABEL] = name
        if gang is not None:
            out[GANG_LABEL] = gang
        return out

    def _env(self, extra: Mapping[str, str], where: str) -> list[dict[str, Any]]:
        _check_plain_env(self.env, "K8sTorchrunLauncher.env")
        _check_plain_env(extra, where)
        merged = {**POD_ENV, **self.env, **extra}
        # JOB_COMPLETION_INDEX is added to every container by the Job controller (Indexed mode).
        env = [{"name": k, "value": str(v)} for k, v in merged.items()]
        return env

    @property
    def processes(self) -> int:
        """torchrun workers per pod: one per GPU unless nproc_per_node says otherwise."""
        return self.nproc_per_node or self.gpus_per_node or 1

    def sizing(self) -> dict[str, str | None]:
        """CPU, memory and /dev/shm per pod, derived from the processes where "auto"; refuses what cannot work."""
        from kubernetes.utils import parse_quantity

        n, gpus = self.processes, self.gpus_per_node
        if gpus and n != gpus:
            raise ValueError(
                f"nproc_per_node={n} with gpus_per_node={gpus}: "
                + (f"{gpus - n} reserved GPU(s) per pod would sit idle" if n < gpus else f"{n} processes would share {gpus} GPU(s)")
                + f"; leave nproc_per_node unset (= gpus_per_node) or set gpus_per_node={n}")
        shm = f"{SHM_PER_GPU_GI * n}Gi" if (self.shm_size == AUTO and gpus) else ("1Gi" if self.shm_size == AUTO else self.shm_size)
        shm_gi = parse_quantity(shm) / 2**30

        def gi(x) -> str:
            return f"{int(x)}Gi" if x == int(x) else f"{int(x * 1024)}Mi"

        out = {
            "cpu_request": str(CPU_PER_PROCESS * n) if self.cpu_request == AUTO else self.cpu_request,
            "cpu_limit": str(CPU_LIMIT_PER_PROCESS * n) if self.cpu_limit == AUTO else self.cpu_limit,
            "memory_request": gi(MEM_PER_PROCESS_GI * n + shm_gi) if self.memory_request == AUTO else self.memory_request,
            "memory_limit": gi(MEM_LIMIT_PER_PROCESS_GI * n + shm_gi) if self.memory_limit == AUTO else self.memory_limit,
            "shm_size": shm,
        }
        if out["memory_limit"] is not None:
            need = shm_gi + MEM_HEADROOM_PER_PROCESS_GI * n
            if parse_quantity(out["memory_limit"]) / 2**30 < need:
                raise ValueError(
                    f"memory_limit={out['memory_limit']} cannot hold /dev/shm ({shm}, memory-backed: it counts against "
                    f"the container's memory limit) plus {MEM_HEADROOM_PER_PROCESS_GI}Gi for each of {n} process(es): "
                    f"raise memory_limit to at least {gi(need)} (or 'auto'), or lower shm_size")
        for kind in ("cpu", "memory"):
            req, lim = out[f"{kind}_request"], out[f"{kind}_limit"]
            if lim is not None and parse_quantity(req) > parse_quantity(lim):
                raise ValueError(f"{kind}_request={req} is above {kind}_limit={lim}: lower the request or raise the limit")
        return out

    def _resources(self) -> dict[str, Any]:
        size = self.sizing()
        requests = {"cpu": size["cpu_request"], "memory": size["memory_request"]}
        limits: dict[str, str] = {}
        if size["cpu_limit"]:
            limits["cpu"] = size["cpu_limit"]
        if size["memory_limit"]:
            limits["memory"] = size["memory_limit"]
        if self.gpus_per_node:
            requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(self.gpus_per_node)
        return {"requests": requests, "limits": limits}

    def pod_parts(self, command: list[str], env: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The pod spec and its one container (security, scratch and storage volumes, /dev/shm, resources):
        the same for training pods and data fan-out pods."""
        volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": self.sizing()["shm_size"]}}]
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
            # The pause container is PID 1: it reaps orphans (DataLoader workers), and torchrun gets the
            # kernel's ordinary signal semantics (a PID 1 ignores signals it has no handler for).
            "shareProcessNamespace": True,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": self.run_as_user,
                "runAsGroup": self.run_as_user,
                "fsGroup": self.run_as_user,
                "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of a big RWX volume per pod
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumes": volumes,
        }
        if self.node_selector:
            pod_spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            pod_spec["tolerations"] = [t.to_k8s() for t in self.tolerations]
        if self.image_pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": s} for s in self.image_pull_secrets]
        container = {
            "name": CONTAINER_NAME,
            "command": command,
            "env": env,
            "volumeMounts": mounts,
            "resources": self._resources(),
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": self.read_only_root_filesystem,
                "runAsNonRoot": True,
                "capabilities": {"drop": ["ALL"]},
            },
        }
        return pod_spec, container

    def render(self, job: TrainingSpec, name: str, image: str | None = None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The Service (None for one node) and the Job as API-ready dicts (camelCase, no secrets)."""
        pod_spec, container = self.pod_parts(self.command(job, name), self._env(job.env, "TrainingSpec.env"))
        if self.nnodes > 1:
            pod_spec["subdomain"] = name  # hostname <job>-<i> + subdomain = DNS record via the Service
            container["ports"] = [{"name": "c10d", "containerPort": self.rdzv_port, "protocol": "TCP"}]
        job_spec = {
            "completionMode": "Indexed",
            "completions": self.nnodes,
            "parallelism": self.nnodes,
            "backoffLimit": 0,
            # A disrupted pod (eviction, preemption, node lost) is not the code's fault: not counted (the
            # launcher resubmits a fresh gang that resumes from the checkpoint). Any other non-zero exit
            # fails the whole Job at once (the controller then kills the peers). First match wins.
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "NotIn", "values": [0]}},
            ]},
            "activeDeadlineSeconds": self.timeout_s,
            "ttlSecondsAfterFinished": self.ttl_seconds_after_finished,
        }
        job_dict = self.job_manifest(name, image, self._labels(job.labels, name, gang_key(job.labels)),
                                     pod_spec, container, job_spec, COMPONENT)
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

    def job_manifest(self, name: str, image: str | None, labels: dict[str, str], pod_spec: dict[str, Any],
                     container: dict[str, Any], job_spec: dict[str, Any], component: str) -> dict[str, Any]:
        """A Job as an API-ready dict through Dagster's builder (common labels, snake/camel conversion)."""
        image = image or self.image
        if not image:
            raise ValueError("K8sTorchrunLauncher.image is not set and there is no launching pod to take it from: set image")
        from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

        manifest = construct_dagster_k8s_job(
            job_config=DagsterK8sJobConfig(
                job_image=image,
                image_pull_policy=PullPolicy(self.image_pull_policy).value,
                service_account_name=self.service_account_name,
                env_secrets=list(self.env_secret_names),  # envFrom secretRef, by name only
            ),
            args=None,
            job_name=name,
            pod_name=name,
            component=component,
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
        return job_dict

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

    def launch(self, context: dg.AssetExecutionContext, job: TrainingSpec) -> None:
        log = context.log
        api = self.api()
        owner, owner_image = self._owner_reference(log, api)
        image = self.image or owner_image
        self._remove_live_gangs(log, api, gang_key(job.labels))
        for attempt in range(self.max_resubmissions + 1):
            try:
                self._run_gang(log, api, job, owner, image)
                return
            except GangDisrupted as e:
                if attempt >= self.max_resubmissions:
                    raise TrainingFailed(
                        f"{e}; the gang was disrupted {attempt + 1} time(s), more than max_resubmissions="
                        f"{self.max_resubmissions}") from None
                log.warning(f"{e}: resubmitting the gang ({attempt + 1}/{self.max_resubmissions}); "
                            "the trainer resumes from its last checkpoint")

    def _run_gang(self, log, api, job: TrainingSpec, owner: dict[str, Any] | None, image: str | None) -> None:
        name = k8s_name(job.name)
        service, manifest = self.render(job, name, image)
        log.info(
            f"Launching training Job {self.namespace}/{name}: {self.nnodes} pod(s) x {self.processes} "
            f"process(es), image {image}, command: {' '.join(self.command(job, name))}"
        )
        self.run_job(log, api, manifest, owner, service=service, what="Training Job",
                     assess_fn=lambda status, pods: assess(status, pods, self.nnodes),
                     fail_fn=lambda status, pods, why: self._fail(log, api, name, pods, why))

    def run_job(self, log, api, manifest: dict[str, Any], owner: dict[str, Any] | None, *,
                what: str, assess_fn, fail_fn, service: dict[str, Any] | None = None, progress=None) -> None:
        """One Job (+ Service): create, supervise (see :meth:`_supervise`), always delete.

        Shared by the training gang and the data fan-out (``k8s_fanout.py``): they differ only in the
        manifest, the verdict (``assess_fn``), the error (``fail_fn``) and the per-poll ``progress`` report.
        """
        from dagster_k8s.client import k8s_api_retry_creation_mutation

        name, ns = manifest["metadata"]["name"], self.namespace
        if owner is not None:  # the launching pod dies -> Kubernetes' garbage collector deletes the Job
            manifest["metadata"]["ownerReferences"] = [owner]
        # Names of Secrets only; the manifest carries no secret values by construction.
        log.debug("Rendered manifests:\n" + yaml.safe_dump_all([m for m in (service, manifest) if m], sort_keys=False))
        follower: _LogFollower | None = None
        try:
            k8s_api_retry_creation_mutation(
                lambda: api.batch_api.create_namespaced_job(ns, manifest), max_retries=3, timeout=1.0
            )
            if service is not None:
                uid = api.batch_api.read_namespaced_job(name, ns).metadata.uid
                service["metadata"]["ownerReferences"] = [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}]  # goes with the Job
                k8s_api_retry_creation_mutation(
                    lambda: api.core_api.create_namespaced_service(ns, service), max_retries=3, timeout=1.0
                )
            follower = _LogFollower(api, ns)
            self._supervise(log, api, name, follower, what, assess_fn, fail_fn, progress)
        except GangDisrupted:
            # The old pods must be gone before a new gang starts: they hold the GPUs, and their rank 0
            # could still write a checkpoint while the new gang loads it.
            self._cleanup(log, api, name, service is not None)
            self._wait_pods_gone(log, api, name)
            raise
        finally:
            # Delete first: whatever interrupted us (failure, timeout, run termination) must not keep
            # the pods alive. Deleting the pods also ends the follow stream of the log thread.
            self._cleanup(log, api, name, service is not None)
            if follower is not None:
                follower.stop()
                follower.drain(log)  # pod 0's last lines before the failure or interruption

    def _wait_pods_gone(self, log, api, name: str) -> None:
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while time.monotonic() < deadline:
            if not api.core_api.list_namespaced_pod(
                    self.namespace, label_selector=f"{JOB_LABEL}={name}", _request_timeout=API_TIMEOUT_S).items:
                return
            time.sleep(self.poll_interval_s)
        log.warning(f"Pods of training Job {self.namespace}/{name} still terminating after {GONE_TIMEOUT_S}s; going on")

    def _owner_reference(self, log, api) -> tuple[dict[str, Any] | None, str | None]:
        """The launching pod as owner of the Job (in-cluster: $HOSTNAME, the pod name; dagster-k8s does the same),
        and its image."""
        name = self.owner_pod or (os.environ.get("HOSTNAME") if self.load_incluster_config else None)
        if not name:
            return None, None
        try:
            pod = api.core_api.read_namespaced_pod(name, self.namespace)
        except kubernetes.client.ApiException as e:
            log.warning(f"Cannot read the launching pod {self.namespace}/{name} ({e.status} {e.reason}): the training "
                        "Job gets no owner; if this process dies, only its TTL and the next launch remove it")
            return None, None
        image = pod.spec.containers[0].image if pod.spec and pod.spec.containers else None
        return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod.metadata.uid}, image

    def _remove_live_gangs(self, log, api, key: str | None, what: str = "training Job") -> None:
        """Delete unfinished gangs of the same asset + partition: two would write one checkpoint folder and MLflow run.

        Deleted rather than adopted: the left-over gang may run another config, and the new gang resumes
        from the same checkpoint, so a restart costs one rendezvous and one checkpoint load.
        """
        if key is None:
            return
        ns = self.namespace
        for other in api.batch_api.list_namespaced_job(ns, label_selector=f"{GANG_LABEL}={key}").items:
            conditions = {c.type for c in (other.status.conditions or []) if c.status == "True"} if other.status else set()
            if conditions & {"Complete", "Failed"} or other.metadata.deletion_timestamp:
                continue
            left_by = (other.metadata.labels or {}).get("dagster/run-id", "?")
            log.warning(f"Deleting live {what} {ns}/{other.metadata.name} of the same asset and partition "
                        f"(left by run {left_by}) before starting a new gang")
            self._cleanup(log, api, other.metadata.name, has_service=True)
            self._wait_pods_gone(log, api, other.metadata.name)

    def _supervise(self, log, api, name: str, follower: _LogFollower, what: str, assess_fn, fail_fn, progress) -> None:
        ns = self.namespace
        now = time.monotonic()
        deadline, start_deadline = now + self.timeout_s, now + self.start_timeout_s
        selector = f"{JOB_LABEL}={name}"
        started = False
        last_note, events, events_read = "", "", 0.0
        while True:
            follower.drain(log)
            pods = api.core_api.list_namespaced_pod(ns, label_selector=selector, _request_timeout=API_TIMEOUT_S).items
            pod0 = latest_pod(pods, 0)  # a retried index has several pods: follow the newest
            if pod0 is not None and pod0.status and pod0.status.phase in ("Running", "Succeeded", "Failed"):
                follower.start(pod0.metadata.name)
            status = api.batch_api.read_namespaced_job(name, ns, _request_timeout=API_TIMEOUT_S).status
            verdict = assess_fn(status, pods)
            if progress is not None:
                progress(status, pods)
            if verdict.kind == "complete":
                follower.start(pod0.metadata.name if pod0 is not None else None)
                follower.wait(timeout=30)
                follower.drain(log)
                log.info(f"{what} {ns}/{name}: {verdict.why}")
                return
            if verdict.kind == "disrupted":
                raise GangDisrupted(f"{what} {ns}/{name} disrupted: {verdict.why}")
            if verdict.reason == "DeadlineExceeded":
                fail_fn(status, pods, f"timed out after {self.timeout_s}s (activeDeadlineSeconds)")
            if verdict.kind in ("failed", "stuck"):
                fail_fn(status, pods, verdict.why)
            now = time.monotonic()
            started = started or verdict.kind == "running"
            if verdict.kind == "waiting" and now - events_read > EVENTS_EVERY_S:
                events, events_read = _warning_events(api, ns, [name, *(p.metadata.name for p in pods)]), now
            note = verdict.why + (f"; events: {events}" if events and verdict.kind == "waiting" else "")
            if note and note != last_note:  # say it once, when it changes; ContainerCreating is only info
                trouble = events or verdict.kind == "running" or "Unschedulable" in note
                (log.warning if trouble else log.info)(f"{what} {ns}/{name}: {note}")
            last_note = note
            if not started and now > start_deadline:
                fail_fn(status, pods, f"pods did not all start within start_timeout_s={self.start_timeout_s}: {note}")
            if now > deadline:
                fail_fn(status, pods, f"timed out after {self.timeout_s}s")
            time.sleep(self.poll_interval_s)

    def failure_report(self, log, api, name: str, pods: Sequence[Any], unit: str = "node") -> str:
        """Copy each given pod's log tail (failed ones first) and the Warning events into the log; return them."""
        parts = []
        failed_first = sorted(pods, key=lambda p: (not _is_failed(p), _completion_index(p)))
        for pod in failed_first:
            tail = _safe_logs(api, pod.metadata.name, self.namespace, self.log_tail_lines)
            state = _pod_state(pod)
            log.error(f"Pod {pod.metadata.name} ({unit} {_completion_index(pod)}) {state}; last log lines:\n{tail}")
            parts.append(f"--- pod {pod.metadata.name} ({unit} {_completion_index(pod)}) {state} ---\n{tail}")
        events = _warning_events(api, self.namespace, [name, *(p.metadata.name for p in pods)])
        if events:
            parts.append(f"--- events ---\n{events}")
        return "\n".join(parts)

    def _fail(self, log, api, name: str, pods: Sequence[Any], why: str) -> None:
        raise TrainingFailed(f"training Job {self.namespace}/{name}: {why}\n" + self.failure_report(log, api, name, pods))

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
                if e.status == 404 and kind == "Service":
                    log.info(f"Deleted Service {ns}/{name} (garbage-collected with its Job)")
                elif e.status != 404:
                    log.warning(f"Could not delete {kind} {ns}/{name} ({e.status} {e.reason}); its TTL will")
            except Exception as e:  # never mask the training outcome with a cleanup error
                log.warning(f"Could not delete {kind} {ns}/{name}: {e!r}")


# -- the supervision verdict (a pure function of Job and Pod objects) ------------------------------


class GangDisrupted(Exception):
    """A pod of the gang was disrupted (eviction, preemption, node lost): resubmit rather than fail."""


@dataclass(frozen=True)
class Verdict:
    kind: str  # running | waiting | complete | disrupted | failed | stuck
    why: str = ""
    reason: str = ""  # the Job condition's reason, when the Job failed


def assess(status, pods: Sequence[Any], nnodes: int) -> Verdict:
    """What the gang is doing, from a ``V1JobStatus`` and its ``V1Pod`` list.

    Order matters: a disruption wins over the failures it causes in the peers (they fail because
    their peer vanished), and a failed pod wins over the Job controller's slower ``Failed``.
    """
    disrupted = [(p, c) for p in pods if (c := _condition(p, "DisruptionTarget"))]
    if disrupted:
        return Verdict("disrupted", "; ".join(
            f"pod {p.metadata.name}: {c.reason or 'DisruptionTarget'}: {c.message or ''}".rstrip(": ") for p, c in disrupted))
    conditions = job_conditions(status)
    failed_cond = conditions.get("Failed") or conditions.get("FailureTarget")
    if failed_cond is not None and failed_cond.reason == "DeadlineExceeded":
        return Verdict("failed", f"Job failed: {failed_cond.reason}: {failed_cond.message}", failed_cond.reason)
    if any(_is_failed(p) for p in pods):  # fail fast: do not wait for the Job controller or hung peers
        return Verdict("failed", "pod(s) failed")
    if failed_cond is not None:
        return Verdict("failed", f"Job failed: {failed_cond.reason}: {failed_cond.message}", failed_cond.reason or "")
    verdict = stuck_or_waiting(pods, nnodes)
    if verdict.kind != "stuck" and ("Complete" in conditions or (status and (status.succeeded or 0) >= nnodes)):
        return Verdict("complete", f"all {nnodes} pod(s) succeeded")
    return verdict


def job_conditions(status) -> dict[str, Any]:
    """The Job's conditions that are true, by type."""
    return {c.type: c for c in (status.conditions or []) if c.status == "True"} if status else {}


def stuck_or_waiting(pods: Sequence[Any], expected: int) -> Verdict:
    """For pods that have not finished: stuck (a waiting reason that will not fix itself), waiting
    (pods missing or Pending, with the scheduler's / kubelet's reasons) or running."""
    stuck = [(p, r) for p in pods if (r := _fatal_waiting_reason(p))]
    if stuck:
        return Verdict("stuck", "cannot start its pods: " + "; ".join(f"{p.metadata.name}: {r}" for p, r in stuck))
    notes = [f"pod {p.metadata.name}: {w}" for p in sorted(pods, key=_completion_index) if (w := _pod_wait(p))]
    waiting = len(pods) < expected or any(p.status is None or p.status.phase == "Pending" for p in pods)
    if len(pods) < expected:
        notes.insert(0, f"{expected - len(pods)} of {expected} pod(s) not created")
    return Verdict("waiting" if waiting else "running", "; ".join(notes))


def gang_key(labels: Mapping[str, str]) -> str | None:
    """One label value per asset + partition (hashed: partition keys need not be valid label values)."""
    asset, partition = labels.get("dagster/asset"), labels.get("dagster/partition")
    if asset is None:
        return None
    return hashlib.sha256(f"{asset}\0{partition or ''}".encode()).hexdigest()[:40]


# -- helpers --------------------------------------------------------------------------------------


def _condition(pod, ctype: str):
    for c in (pod.status.conditions or []) if pod.status else []:
        if c.type == ctype and c.status == "True":
            return c
    return None


def _is_failed(pod) -> bool:
    return bool(pod.status and pod.status.phase == "Failed")


def _pod_wait(pod) -> str:
    """Why a pod is not (fully) running, in the scheduler's / kubelet's words; "" when it is fine."""
    if pod.status is None:
        return "no status yet"
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False":
            return f"{c.reason or 'Unscheduled'}: {c.message or ''}".rstrip(": ")
        if c.type == "Ready" and c.status == "False" and pod.status.phase == "Running":  # e.g. its node NotReady
            return f"not Ready ({c.reason or 'no reason given'}): {c.message or ''}".rstrip(": ")
    if pod.status.phase == "Pending":
        for cs in pod.status.container_statuses or []:
            if cs.state and cs.state.waiting is not None:
                return f"{cs.state.waiting.reason or 'Waiting'} {cs.state.waiting.message or ''}".strip()
        return "Pending"
    return ""


def _warning_events(api, namespace: str, names: Sequence[str], limit: int = 8) -> str:
    """The Warning events of the Job and its pods (quota, admission, scheduling, image pulls, volumes)."""
    seen: dict[tuple[str, str], str] = {}
    for name in names:
        try:
            items = api.core_api.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={name}", _request_timeout=API_TIMEOUT_S).items
        except Exception as e:  # events are a diagnosis; never let them hide the outcome
            return f"<events unavailable: {e!r}>"
        for ev in items:
            if ev.type == "Warning":
                seen[(name, ev.reason or "")] = f"{name}: {ev.reason}: {ev.message}"
    return "; ".join(list(seen.values())[-limit:])


def latest_pod(pods: Sequence[Any], index: int):
    """The newest pod of a completion index (the Job controller replaces failed and disrupted ones), or None."""
    def newest(p) -> tuple[float, bool]:  # creation times have 1 s resolution: an unfinished pod wins a tie
        created = p.metadata.creation_timestamp
        return (created.timestamp() if created else 0.0, not (p.status and p.status.phase in ("Succeeded", "Failed")))

    return max((p for p in pods if _completion_index(p) == index), key=newest, default=None)


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
    """Follows one pod's log at a time on a background thread; the caller drains lines into ``context.log``.

    Lines go through a queue so that only the launching thread touches the Dagster logger. A stream
    that ends or breaks while the pod still runs (API server restart, kubelet hiccup, idle timeout of a
    proxy) is re-opened and the lines already delivered are skipped, so nothing repeats or goes missing
    (unless the kubelet rotated the log file in between, at 10 MiB by default).
    """

    def __init__(self, api, namespace: str, max_reconnects: int = 100):
        self._api = api
        self._ns = namespace
        self._lines: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._max_reconnects = max_reconnects
        self.pod: str | None = None

    def start(self, pod: str | None) -> None:
        """Follow ``pod``; a different pod (a retried index) once the previous stream has ended."""
        if pod is None or pod == self.pod or (self._thread is not None and self._thread.is_alive()):
            return
        self.pod = pod
        self._thread = threading.Thread(target=self._run, args=(pod,), name=f"logs-{pod}", daemon=True)
        self._thread.start()

    def _run(self, pod: str) -> None:
        delivered, failures = 0, 0
        while failures < self._max_reconnects:  # consecutive re-opens without a new line
            if self._stop.is_set():
                return
            buf, n, before = b"", 0, delivered
            try:
                response = self._api.core_api.read_namespaced_pod_log(
                    pod, self._ns, container=CONTAINER_NAME, follow=True, _preload_content=False
                )
                for chunk in response.stream(4096):
                    if self._stop.is_set():
                        return
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        n += 1
                        if n > delivered:
                            self._lines.put(f"[{pod}] " + line.decode("utf-8", "replace"))
                            delivered = n
                if self._finished(pod):  # a clean end of a finished container: flush the unterminated last line
                    if buf and n + 1 > delivered:
                        self._lines.put(f"[{pod}] " + buf.decode("utf-8", "replace"))
                    return
            except kubernetes.client.ApiException as e:
                if e.status == 404:  # the pod is gone
                    return
            except Exception:
                if self._stop.is_set():
                    return
            failures = 0 if delivered > before else failures + 1
            time.sleep(min(5.0, 0.2 * (failures + 1)))  # 400 (not started yet) or a broken stream: re-open
        self._lines.put(f"[{pod}] <log stream given up after {self._max_reconnects} reconnects>")

    def _finished(self, pod_name: str) -> bool:
        try:
            pod = self._api.core_api.read_namespaced_pod(pod_name, self._ns, _request_timeout=API_TIMEOUT_S)
        except kubernetes.client.ApiException as e:
            return e.status == 404
        except Exception:
            return False
        return bool(pod.status and pod.status.phase in ("Succeeded", "Failed"))

    def drain(self, log) -> None:
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            source, _, text = line.partition("] ")  # lines carry their pod: "[pod] text"
            log_trainer_line(log, text, source=source + "]")

    def wait(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> None:
        """Stop following; the daemon thread ends when the (deleted) pod's log stream closes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
