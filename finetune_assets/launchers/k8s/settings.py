"""The launcher's settings: constants, enums and the typed fields (what a user configures)."""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

import dagster as dg
from pydantic import Field

from finetune_assets.launchers.base import TRAINER_MODULE, TrainingLauncher

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



class K8sSettings(TrainingLauncher):
    """The fields of :class:`~finetune_assets.launchers.k8s.K8sTorchrunLauncher` and what derives from them."""

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
    api_outage_budget_s: float = Field(
        default=600, gt=0, description="How long API calls are retried (429, 5xx, 401, connection errors) "
        "before the launcher gives up; the gang keeps running meanwhile (supervision only lost sight of it).")
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

