"""The Kubernetes ``launcher`` resource: the fields a user configures (launchpad:
``resources.launcher.config``, or ``FINETUNE_ASSETS_K8S_*``), over the Dagster-free launcher
(``core/launchers/k8s/``) it mixes in; deploy/README.md documents every field.

Two pieces are Dagster's and so live here: the typed config (``dg.Config`` tolerations, the
launchpad schema) and the Job builder, dagster-k8s's ``construct_dagster_k8s_job``.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import kubernetes
from pydantic import Field, model_validator

from finetune_assets.core.launchers.base import TRAINER_MODULE, TrainingSpec
from finetune_assets.core.launchers.k8s.constants import (
    AUTO,
    CPU_LIMIT_PER_PROCESS,
    CPU_PER_PROCESS,
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
from finetune_assets.core.launchers.k8s.launcher import K8sLauncher
from finetune_assets.defs.resources.launchers import DagsterRun, TrainingLauncher


class Toleration(dg.Config):
    """One pod toleration (e.g. for tainted GPU nodes: key ``nvidia.com/gpu``, operator
    ``Exists``).
    """

    key: str | None = None
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str | None = None
    effect: TaintEffect | None = None
    toleration_seconds: int | None = None


class K8sTorchrunLauncher(K8sLauncher, TrainingLauncher):
    """Runs the torchrun command as ``nnodes`` pods of an Indexed Job (or of a JobSet's one
    Indexed Job: ``backend``) with c10d rendezvous on pod 0 (``core/launchers/k8s/``).
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

    @model_validator(mode="after")
    def _coherent(self):
        """What no pod could run with is refused when the resource is built (core's rules)."""
        self.check_settings()
        return self

    def launch(self, context: dg.AssetExecutionContext, job: TrainingSpec) -> None:
        self.train(DagsterRun(context), job)

    def build_job(
        self, name: str, image: str, labels: dict[str, str], parts: dict[str, Any], component: str
    ) -> dict[str, Any]:
        """Through Dagster's Job builder: its common labels, label sanitizing, snake/camel
        conversion and model checks of the passthrough.
        """
        from dagster_k8s.job import (
            DagsterK8sJobConfig,
            UserDefinedDagsterK8sConfig,
            construct_dagster_k8s_job,
        )

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
            user_defined_k8s_config=UserDefinedDagsterK8sConfig.from_dict(parts),
        )
        return kubernetes.client.ApiClient().sanitize_for_serialization(manifest)
