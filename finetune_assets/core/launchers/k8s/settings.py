"""The launcher's settings: constants, enums and the typed fields (what a user configures)."""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import Field, model_validator

from finetune_assets.core.launchers.base import TRAINER_MODULE, TrainingLauncher
from finetune_assets.core.launchers.k8s.constants import (
    AUTO,
    CPU_LIMIT_PER_PROCESS,
    CPU_PER_PROCESS,
    MEM_HEADROOM_PER_PROCESS_GI,
    MEM_LIMIT_PER_PROCESS_GI,
    MEM_PER_PROCESS_GI,
    SHM_PER_GPU_GI,
    Backend,
    PodSecurityLevel,
    PropagationPolicy,
    PullPolicy,
    TaintEffect,
    TolerationOperator,
)


class Toleration(dg.Config):
    """One pod toleration (e.g. for tainted GPU nodes: key ``nvidia.com/gpu``, operator
    ``Exists``).
    """

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
    """The fields of :class:`~finetune_assets.core.launchers.k8s.K8sTorchrunLauncher` and what
    derives
    from them.
    """

    image: str | None = Field(
        default=None,
        description="Image with this package installed (deploy/Dockerfile). Unset: the launching "
        "pod's "
        "own image (in-cluster), so the Helm values name the image once.",
    )
    namespace: str = Field(default="default", description="Namespace of the Job, Service and pods.")
    backend: Backend = Field(
        default=Backend.JOB,
        description="'job': an Indexed Job + headless Service; the launcher resubmits a fresh "
        "gang after a disruption (max_resubmissions). 'jobset': a JobSet (jobset.x-k8s.io, its "
        "controller installed in the cluster) of one Indexed Job; its controller recreates the "
        "whole gang server-side after any pod failure (jobset_max_restarts), also while this "
        "process is gone, and can place the gang exclusively in one topology domain "
        "(exclusive_topology).",
    )
    jobset_max_restarts: int = Field(
        default=3,
        ge=0,
        le=9,
        description="backend 'jobset': the JobSet's failurePolicy.maxRestarts, gang restarts by "
        "its controller (a killed pod, a lost node, a crashed rank), each resuming from the "
        "checkpoint; a timeout or a configuration error (exit 78) is never restarted. At most 9: "
        "the restart is the last digit of the gang's fencing generation.",
    )
    exclusive_topology: str | None = Field(
        default=None,
        description="backend 'jobset': a node label key (e.g. cloud.google.com/gke-nodepool, a "
        "rack or block label, kubernetes.io/hostname) whose one domain the gang gets to itself "
        "(alpha.jobset.sigs.k8s.io/exclusive-topology): all its pods in the domain of pod 0, no "
        "other JobSet's pods beside them.",
    )
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    image_pull_secrets: list[str] = Field(default_factory=list)
    nnodes: int = Field(
        default=1, ge=1, description="Pods (torchrun nodes); each runs nproc_per_node workers."
    )
    gpus_per_node: int = Field(
        default=0, ge=0, description="nvidia.com/gpu per pod; processes per pod follow it."
    )
    nproc_per_node: int | None = Field(  # type: ignore[assignment]
        default=None,
        ge=1,
        description="Processes per pod; unset = gpus_per_node (one per GPU), or 1 without GPUs.",
    )
    cuda_preflight: bool = Field(
        default=True,
        description="With gpus_per_node > 0, each pod first checks that CUDA sees its GPUs and "
        "exits at once (a configuration error, never retried) when it does not, instead of "
        "training on CPU while the GPUs sit reserved. Off only where GPUs are counted but not "
        "real (the local test plane).",
    )
    nvidia_driver_path: str = Field(
        default="/usr/local/nvidia/lib64",
        description="Where the node's NVIDIA driver libraries are mounted in GPU pods (GKE's "
        "device plugin: /usr/local/nvidia/lib64; the NVIDIA container toolkit (EKS, AKS, GPU "
        "operator) injects them into the loader path, where this is harmless): put on "
        "LD_LIBRARY_PATH of GPU pods, named by the CUDA preflight.",
    )
    pod_security_level: PodSecurityLevel = Field(
        default=PodSecurityLevel.RESTRICTED,
        description="The Pod Security level the namespace enforces (deploy/namespace.yaml: "
        "restricted). What it would refuse (hostNetwork, added capabilities such as IPC_LOCK, "
        "hostPath volumes) is refused when the resource is built, with the reason, instead of "
        "pods that the API server never admits.",
    )
    host_network: bool = Field(
        default=False,
        description="Fast fabrics that need the host's network (GPUDirect-TCPX/TCPXO on GKE, "
        "some RoCE setups): pods on the node's network namespace (dnsPolicy "
        "ClusterFirstWithHostNet). Needs pod_security_level=privileged (a namespace of its own).",
    )
    extra_resources: dict[str, str] = Field(
        default_factory=dict,
        description="Extra device resources per training pod, requests = limits: e.g. "
        '{"vpc.amazonaws.com/efa": "32"} (AWS EFA), {"rdma/rdma_shared_device_a": "1"} '
        "(InfiniBand / RoCE through an RDMA device plugin). Allowed at every Pod Security level.",
    )
    # "auto" = sized from the processes per pod (see `sizing`); None = no limit.
    guaranteed_qos: bool = Field(
        default=True,
        description="'auto' requests equal the limits (QoS Guaranteed: the kubelet evicts "
        "Burstable pods first under node pressure, and a training gang is the costliest thing "
        "to evict). False: 'auto' requests are the smaller per-process values below.",
    )
    cpu_request: str = Field(
        default=AUTO,
        description=f"'auto' = the CPU limit (guaranteed_qos), else {CPU_PER_PROCESS} core(s) per "
        "process.",
    )
    cpu_limit: str | None = Field(
        default=AUTO,
        description=f"'auto' = {CPU_LIMIT_PER_PROCESS} cores per process; None = no limit.",
    )
    memory_request: str = Field(
        default=AUTO, description=f"'auto' = {MEM_PER_PROCESS_GI}Gi per process + /dev/shm."
    )
    memory_limit: str | None = Field(
        default=AUTO,
        description=f"'auto' = {MEM_LIMIT_PER_PROCESS_GI}Gi per process + /dev/shm; None = no "
        "limit.",
    )
    shm_size: str = Field(
        default=AUTO,
        description="Memory-backed /dev/shm (DataLoader, NCCL, streaming); counts against the "
        "memory "
        f"limit. 'auto' = {SHM_PER_GPU_GI}Gi per GPU process, else 1Gi.",
    )
    scratch_size: str = Field(
        default="8Gi", description="Size limit of each writable emptyDir (/tmp, /cache)."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Training pods (the GPU pool)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Training pods (the GPU pool)."
    )
    k8s_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Pod-template passthrough for the training pods, in dagster-k8s's "
        "UserDefinedDagsterK8sConfig shape (see core/launchers/k8s/passthrough.py): annotations, "
        "priorityClassName, "
        "schedulerName, affinity, runtimeClassName, extra resources...",
    )
    # The data fan-out's CPU workers get their own pool: nothing above is inherited.
    worker_node_selector: dict[str, str] = Field(
        default_factory=dict, description="Data worker pods (CPU pool)."
    )
    worker_tolerations: list[Toleration] = Field(
        default_factory=list, description="Data worker pods."
    )
    worker_cpu_request: str = Field(
        default=AUTO, description=f"Data worker pods; 'auto' = {CPU_PER_PROCESS} core."
    )
    worker_memory_request: str = Field(
        default=AUTO, description="Data worker pods; 'auto' as for one process."
    )
    worker_memory_limit: str | None = Field(
        default=AUTO, description="Data worker pods; None = no limit."
    )
    worker_k8s_config: dict[str, Any] = Field(
        default_factory=dict, description="Passthrough for data worker pods."
    )
    queue_name: str | None = Field(
        default=None,
        description="Kueue LocalQueue: the Job is created suspended with the "
        "kueue.x-k8s.io/queue-name label, and Kueue admits the whole gang at once (see "
        "deploy/README.md).",
    )
    deployment: str = Field(
        default="default",
        description="This deployment's name: with the namespace, part of the gang key, so two "
        "deployments training the same partition in one namespace never touch each other's Jobs.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra non-secret environment for the pods."
    )
    env_secret_names: list[str] = Field(
        default_factory=list,
        description=(
            "Kubernetes Secrets whose keys become environment variables (envFrom): storage and "
            "MLflow credentials."
        ),
    )
    service_account_name: str | None = Field(
        default=None, description="SA of the training pods (needs no RBAC)."
    )
    storage_pvc_name: str | None = Field(
        default=None,
        description="A ReadWriteMany PVC to mount as the shared storage root (instead of s3://).",
    )
    storage_mount_path: str = Field(
        default="/data", description="Where storage_pvc_name is mounted in the pods."
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra labels on the Job, Service and pods."
    )
    rdzv_port: int = Field(default=29400, ge=1, le=65535)
    rdzv_timeout_s: int = Field(
        default=1800,
        ge=1,
        description="c10d rendezvous join and read timeout: longer than the worst gap between "
        "the first and the last "
        "pod starting (GPU node scale-up, a multi-GB image pull). torchrun's own default read "
        "timeout is 60 s.",
    )
    timeout_s: int = Field(
        default=24 * 3600,
        ge=1,
        description="Wall-clock limit (also the Job's activeDeadlineSeconds).",
    )
    ttl_seconds_after_finished: int = Field(default=3600, ge=0)
    delete_propagation_policy: PropagationPolicy = Field(
        default=PropagationPolicy.FOREGROUND,
        description="Foreground: the Job object stays (deletionTimestamp set) until its pods are "
        "gone, so the next launch still finds it and waits.",
    )
    gone_timeout_s: int = Field(
        default=1800,
        ge=1,
        description="How long a new gang waits for the previous gang's pods to be gone (a pod on "
        "a lost node stays until the node is confirmed down) before the launch fails instead of "
        "overlapping them.",
    )
    run_as_user: int = Field(default=1000, ge=1)
    read_only_root_filesystem: bool = True
    python: str = Field(default="python", description="The interpreter inside the image.")
    trainer_module: str = Field(
        default=TRAINER_MODULE, description="Module torchrun runs (tests use a stand-in)."
    )
    load_incluster_config: bool = Field(
        default=True, description="True inside the cluster (run pods); else kubeconfig."
    )
    kubeconfig_file: str | None = Field(
        default=None, description="Kubeconfig path; None = $KUBECONFIG or ~/.kube/config."
    )
    kube_context: str | None = None
    poll_interval_s: float = Field(default=2.0, gt=0)
    api_outage_budget_s: float = Field(
        default=600,
        gt=0,
        description="How long API calls are retried (429, 5xx, 401, connection errors) "
        "before the launcher gives up; the gang keeps running meanwhile (supervision only lost "
        "sight of it).",
    )
    start_timeout_s: int = Field(
        default=1800,
        ge=1,
        description="How long pods may stay Pending (scheduling, node scale-up, image pull, quota) "
        "before the launch fails with the scheduler's / admission's reason.",
    )
    queue_timeout_s: int = Field(
        default=24 * 3600,
        ge=1,
        description="How long a suspended (Kueue-queued) Job may wait for admission; "
        "start_timeout_s and timeout_s count from admission.",
    )
    max_resubmissions: int = Field(
        default=3,
        ge=0,
        description="Fresh gangs after a disruption (eviction, preemption, node lost); each "
        "resumes "
        "from the last checkpoint. Failures of the training code itself are never resubmitted.",
    )
    owner_pod: str | None = Field(
        default=None,
        description="Pod that owns the training Job, so Kubernetes deletes the gang when it dies. "
        "Unset: in-cluster this pod ($HOSTNAME), outside none.",
    )
    owner_container: str = Field(
        default="dagster",
        description="The launching pod's container whose image the gang runs when image is "
        "unset (dagster-k8s names the run container 'dagster'; a mesh sidecar may be listed "
        "first).",
    )
    log_tail_lines: int = Field(default=100, ge=1)

    @property
    def processes(self) -> int:
        """torchrun workers per pod: one per GPU unless nproc_per_node says otherwise."""
        return self.nproc_per_node or self.gpus_per_node or 1

    def sizing(self) -> dict[str, str | None]:
        """CPU, memory and /dev/shm per pod, derived from the processes where "auto"; refuses
        what cannot work.
        """
        from kubernetes.utils import parse_quantity

        n, gpus = self.processes, self.gpus_per_node
        if gpus and n != gpus:
            raise ValueError(
                f"nproc_per_node={n} with gpus_per_node={gpus}: "
                + (
                    f"{gpus - n} reserved GPU(s) per pod would sit idle"
                    if n < gpus
                    else f"{n} processes would share {gpus} GPU(s)"
                )
                + f"; leave nproc_per_node unset (= gpus_per_node) or set gpus_per_node={n}"
            )
        shm = (
            f"{SHM_PER_GPU_GI * n}Gi"
            if (self.shm_size == AUTO and gpus)
            else ("1Gi" if self.shm_size == AUTO else self.shm_size)
        )
        shm_gi = parse_quantity(shm) / 2**30

        def gi(x) -> str:
            return f"{int(x)}Gi" if x == int(x) else f"{int(x * 1024)}Mi"

        out = {
            "cpu_request": str(CPU_PER_PROCESS * n)
            if self.cpu_request == AUTO
            else self.cpu_request,
            "cpu_limit": str(CPU_LIMIT_PER_PROCESS * n)
            if self.cpu_limit == AUTO
            else self.cpu_limit,
            "memory_request": gi(MEM_PER_PROCESS_GI * n + shm_gi)
            if self.memory_request == AUTO
            else self.memory_request,
            "memory_limit": gi(MEM_LIMIT_PER_PROCESS_GI * n + shm_gi)
            if self.memory_limit == AUTO
            else self.memory_limit,
            "shm_size": shm,
        }
        if self.guaranteed_qos:  # 'auto' requests follow the limits (set or auto)
            for kind in ("cpu", "memory"):
                if getattr(self, f"{kind}_request") == AUTO and out[f"{kind}_limit"] is not None:
                    out[f"{kind}_request"] = out[f"{kind}_limit"]
        if out["memory_limit"] is not None:
            need = shm_gi + MEM_HEADROOM_PER_PROCESS_GI * n
            if parse_quantity(out["memory_limit"]) / 2**30 < need:
                raise ValueError(
                    f"memory_limit={out['memory_limit']} cannot hold /dev/shm ({shm}, "
                    "memory-backed: it counts against "
                    f"the container's memory limit) plus {MEM_HEADROOM_PER_PROCESS_GI}Gi for "
                    f"each of {n} process(es): "
                    f"raise memory_limit to at least {gi(need)} (or 'auto'), or lower shm_size"
                )
        for kind in ("cpu", "memory"):
            req, lim = out[f"{kind}_request"], out[f"{kind}_limit"]
            if lim is not None and parse_quantity(req) > parse_quantity(lim):
                raise ValueError(
                    f"{kind}_request={req} is above {kind}_limit={lim}: lower the request or "
                    "raise the limit"
                )
        return out

    @model_validator(mode="after")
    def _valid_passthrough(self):
        from finetune_assets.core.launchers.k8s.passthrough import refused_by_pod_security, validate

        validate(self.k8s_config, "k8s_config")
        validate(self.worker_k8s_config, "worker_k8s_config")
        level = PodSecurityLevel(self.pod_security_level).value
        wanted = [("host_network", {"pod_spec_config": {"hostNetwork": True}})] * self.host_network
        wanted += [("k8s_config", self.k8s_config), ("worker_k8s_config", self.worker_k8s_config)]
        for where, config in wanted:
            why = refused_by_pod_security(config, level)
            if why:
                raise ValueError(
                    f"{where}: {why}, which Pod Security {level!r} (pod_security_level, the "
                    "namespace's pod-security.kubernetes.io/enforce label) refuses: the API server "
                    "would admit no pod of the gang. Fast fabrics that need it run in a namespace "
                    "of their own enforcing 'privileged' (set pod_security_level='privileged' "
                    "there); EFA / RDMA device resources alone need no privilege (extra_resources)"
                )
        return self

    @model_validator(mode="after")
    def _jobset_fields_need_jobset(self):
        if Backend(self.backend) is Backend.JOB and self.exclusive_topology:
            raise ValueError(
                f"exclusive_topology={self.exclusive_topology!r} needs backend='jobset': an "
                "Indexed Job has no exclusive placement (the JobSet controller makes it)"
            )
        return self

    @property
    def gang_scope(self) -> str:
        """What, beside asset + partition, tells this deployment's Jobs from another's."""
        return f"{self.namespace}/{self.deployment}"

    @model_validator(mode="after")
    def _coherent_timeouts(self):
        """Pods that start first wait in the rendezvous for the last one: if that wait ends before
        the launcher's own start timeout, early pods fail holding their GPUs while the gang could
        still form.
        """
        if self.nnodes > 1 and self.rdzv_timeout_s < self.start_timeout_s:
            raise ValueError(
                f"rdzv_timeout_s={self.rdzv_timeout_s} is shorter than "
                f"start_timeout_s={self.start_timeout_s}: "
                "early pods would leave the rendezvous before the last pod may start; raise "
                "rdzv_timeout_s "
                "or lower start_timeout_s"
            )
        return self
