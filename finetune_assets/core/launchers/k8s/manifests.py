"""Rendering: the Job, the Service and the pod template as API-ready dicts (no secrets, no API
calls).
"""

from __future__ import annotations

import hashlib
import re
import shlex
import uuid
from collections.abc import Mapping
from typing import Any

from finetune_assets.core.launchers.base import TrainingSpec, torchrun_command
from finetune_assets.core.launchers.k8s.constants import (
    _DNS_LABEL,
    _LABEL_KEY,
    _SECRET_ENV,
    COMPONENT,
    CONTAINER_NAME,
    DEPLOYMENT_LABEL,
    GANG_LABEL,
    JOB_LABEL,
    POD_ENV,
    QUEUE_LABEL,
    SCRATCH_MOUNTS,
    Backend,
)
from finetune_assets.core.launchers.k8s.passthrough import deep_merge
from finetune_assets.core.launchers.k8s.settings import toleration
from finetune_assets.core.training import cuda_preflight
from finetune_assets.core.training.checkpoints.fencing import GENERATION_ENV


def k8s_name(base: str, *, max_len: int = 40) -> str:
    """A DNS-1123 label from ``base`` plus a random suffix (a retried run never collides).

    ``max_len`` leaves room for the pod hostname ``<name>-<index>`` and the generated pod names.
    """
    stem = _DNS_LABEL.sub("-", base.lower()).strip("-")[:max_len].strip("-") or "train"
    if not stem[0].isalpha():
        stem = "t-" + stem[: max_len - 2]
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def pod0_hosts_the_store(cmd: list[str], port: int) -> list[str]:
    """Wrap a multi-node torchrun command so that pod 0 always hosts the c10d store (TorchX does the
    same).

    torchrun hosts the store only when the endpoint resolves to its own address; while cluster DNS
    lags behind a new pod nobody would host it and every pod fails. Pod 0 is given ``localhost``
    (always its own), the others pod 0's DNS name; one pod template serves every index, hence the
    ``sh`` test on ``JOB_COMPLETION_INDEX`` (``exec``: no shell stays behind). Rank 0 lands on pod 0
    because c10d orders nodes by address and ``<job>-0.`` sorts before every ``<job>-<i>.``.
    """
    i = cmd.index("--rdzv-endpoint")
    endpoint = cmd[i + 1]
    rest = cmd[:i] + cmd[i + 2 :]
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
                f"{where}: {key!r} looks like a credential; put it in a Kubernetes Secret and "
                "list the "
                "Secret's name in env_secret_names instead of passing its value"
            )


def gang_key(labels: Mapping[str, str], scope: str = "") -> str | None:
    """One label value per deployment (``scope``: namespace/deployment) + asset + partition, hashed
    (partition keys need not be valid label values).
    """
    asset, partition = labels.get("dagster/asset"), labels.get("dagster/partition")
    if asset is None:
        return None
    return hashlib.sha256(f"{scope}\0{asset}\0{partition or ''}".encode()).hexdigest()[:40]


class ManifestsMixin:
    """The rendering half of the launcher."""

    def rdzv_host(self, name: str) -> str:
        """Pod 0's DNS name through the headless Service (``<job>-0.<service>.<ns>.svc``; the
        JobSet's own Service for backend ``jobset``).
        """
        if Backend(self.backend) is Backend.JOBSET:
            from finetune_assets.core.launchers.k8s.jobset import pod0_host

            return pod0_host(name, self.namespace)
        return f"{name}-0.{name}.{self.namespace}.svc"

    def command(self, job: TrainingSpec, name: str) -> list[str]:
        """The container command: the same torchrun command as the local launcher, per node;
        with GPUs first the CUDA preflight (``finetune_assets/core/training/cuda_preflight.py``).
        """
        cmd = self._torchrun(job, name)
        if self.gpus_per_node and self.cuda_preflight:
            preflight = "finetune_assets.core.training.cuda_preflight"
            check = f"{shlex.quote(self.python)} -m {preflight} || exit $?"
            if cmd[:2] == ["sh", "-c"]:  # the multi-node script: one shell, check first
                cmd = [*cmd[:2], f"{check}; {cmd[2]}", *cmd[3:]]
            else:
                cmd = ["sh", "-c", f'{check}; exec "$0" "$@"', *cmd]
        return cmd

    def gpu_env(self, image: str | None) -> dict[str, str]:
        """What a GPU pod needs beside its resources: the driver on the loader path, and what the
        CUDA preflight checks and names.
        """
        if not self.gpus_per_node:
            return {}
        driver = self.nvidia_driver_path
        return {
            "LD_LIBRARY_PATH": f"{driver}:{driver.rstrip('/').removesuffix('64')}",
            cuda_preflight.EXPECT_ENV: str(self.gpus_per_node),
            cuda_preflight.IMAGE_ENV: image or self.image or "",
            cuda_preflight.DRIVER_PATH_ENV: driver,
        }

    def _torchrun(self, job: TrainingSpec, name: str) -> list[str]:
        if self.nnodes == 1:
            return torchrun_command(
                job.config_url,
                nproc_per_node=self.processes,
                max_restarts=self.max_restarts,
                python=self.python,
                module=self.trainer_module,
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
        out[DEPLOYMENT_LABEL] = sanitize_label_value(self.deployment)
        if gang is not None:
            out[GANG_LABEL] = gang
        if self.queue_name:
            out[QUEUE_LABEL] = sanitize_label_value(self.queue_name)
        return out

    def _env(self, extra: Mapping[str, str], where: str) -> list[dict[str, Any]]:
        _check_plain_env(self.env, "K8sTorchrunLauncher.env")
        _check_plain_env(extra, where)
        merged = {**POD_ENV, **self.env, **extra}
        # JOB_COMPLETION_INDEX is added to every container by the Job controller (Indexed mode).
        env = [{"name": k, "value": str(v)} for k, v in merged.items()]
        return env

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
        for resource, count in self.extra_resources.items():  # EFA, RDMA: devices, not shares
            requests[resource] = limits[resource] = str(count)
        return {"requests": requests, "limits": limits}

    def pod_parts(
        self, command: list[str], env: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The pod spec and its one container (security, scratch and storage volumes, /dev/shm,
        resources): the same for training pods and data fan-out pods.
        """
        volumes = [
            {
                "name": "dshm",
                "emptyDir": {"medium": "Memory", "sizeLimit": self.sizing()["shm_size"]},
            }
        ]
        volumes += [
            {"name": v, "emptyDir": {"sizeLimit": self.scratch_size}} for v in SCRATCH_MOUNTS
        ]
        mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
        mounts += [{"name": v, "mountPath": p} for v, p in SCRATCH_MOUNTS.items()]
        if self.storage_pvc_name:
            volumes.append(
                {"name": "storage", "persistentVolumeClaim": {"claimName": self.storage_pvc_name}}
            )
            mounts.append({"name": "storage", "mountPath": self.storage_mount_path})
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",  # torchrun restarts workers; a dead node fails the Job
            "automountServiceAccountToken": False,  # the trainer never calls the Kubernetes API
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 30,
            # The pause container is PID 1: it reaps orphans (DataLoader workers), and torchrun gets
            # the kernel's ordinary signal semantics (a PID 1 ignores signals it has no handler
            # for).
            "shareProcessNamespace": True,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": self.run_as_user,
                "runAsGroup": self.run_as_user,
                "fsGroup": self.run_as_user,
                # no recursive chown of a big RWX volume per pod
                "fsGroupChangePolicy": "OnRootMismatch",
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumes": volumes,
        }
        if self.node_selector:
            pod_spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            pod_spec["tolerations"] = [toleration(t) for t in self.tolerations]
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

    def render(
        self,
        job: TrainingSpec,
        name: str,
        image: str | None = None,
        generation: int | None = None,
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The Service (None for one node) and the Job as API-ready dicts (camelCase, no
        secrets). ``generation``: this gang's fencing token
        (``core/training/checkpoints/fencing.py``).
        """
        extra = {**self.gpu_env(image), **job.env}
        if generation is not None:
            extra[GENERATION_ENV] = str(generation)
        pod_spec, container = self.pod_parts(
            self.command(job, name), self._env(extra, "TrainingSpec.env")
        )
        if self.host_network:  # fast fabrics (pod_security_level privileged, checked)
            pod_spec["hostNetwork"] = True
            pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"  # the Service's names still resolve
        if self.nnodes > 1:
            pod_spec["subdomain"] = (
                name  # hostname <job>-<i> + subdomain = DNS record via the Service
            )
            container["ports"] = [
                {"name": "c10d", "containerPort": self.rdzv_port, "protocol": "TCP"}
            ]
        job_spec = {
            "completionMode": "Indexed",
            "completions": self.nnodes,
            "parallelism": self.nnodes,
            "backoffLimit": 0,
            # A disrupted pod (eviction, preemption, node lost) is not the code's fault: not counted
            # (the launcher resubmits a fresh gang that resumes from the checkpoint). Any other
            # non-zero exit fails the whole Job at once (the controller then kills the peers). First
            # match wins.
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    },
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": CONTAINER_NAME,
                            "operator": "NotIn",
                            "values": [0],
                        },
                    },
                ]
            },
            "activeDeadlineSeconds": self.timeout_s,
            "ttlSecondsAfterFinished": self.ttl_seconds_after_finished,
        }
        job_dict = self.job_manifest(
            name,
            image,
            self._labels(job.labels, name, gang_key(job.labels, self.gang_scope)),
            pod_spec,
            container,
            job_spec,
            COMPONENT,
        )
        service = None
        if self.nnodes > 1:
            service = {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "labels": job_dict["metadata"]["labels"],
                },
                "spec": {
                    "clusterIP": "None",  # headless: DNS answers with the pod IPs
                    "publishNotReadyAddresses": True,  # pod 0 resolvable before it is "ready"
                    "selector": {JOB_LABEL: name},
                    "ports": [
                        {
                            "name": "c10d",
                            "port": self.rdzv_port,
                            "targetPort": self.rdzv_port,
                            "protocol": "TCP",
                        }
                    ],
                },
            }
        return service, job_dict

    def job_manifest(
        self,
        name: str,
        image: str | None,
        labels: dict[str, str],
        pod_spec: dict[str, Any],
        container: dict[str, Any],
        job_spec: dict[str, Any],
        component: str,
    ) -> dict[str, Any]:
        """A Job as an API-ready dict: what the launcher renders, the ``k8s_config`` passthrough
        merged over it, built by :meth:`build_job`.
        """
        image = image or self.image
        if not image:
            raise ValueError(
                "K8sTorchrunLauncher.image is not set and there is no launching pod to take it "
                "from: set image"
            )
        if self.queue_name:  # Kueue admits (unsuspends) the whole Job once its quota is free
            job_spec = {**job_spec, "suspend": True}
        parts = deep_merge(
            {
                "container_config": container,
                "pod_spec_config": pod_spec,
                "job_spec_config": job_spec,
                "job_metadata": {"namespace": self.namespace},
            },
            self.k8s_config,
        )
        job_dict = self.build_job(name, image, labels, parts, component)
        # The Job controller adds the completion index to each pod; the template may not name pods.
        job_dict["spec"]["template"]["metadata"].pop("name", None)
        return job_dict

    def build_job(
        self, name: str, image: str, labels: dict[str, str], parts: dict[str, Any], component: str
    ) -> dict[str, Any]:
        """The Job from ``parts`` (dagster-k8s's ``UserDefinedDagsterK8sConfig`` shape) as an
        API-ready dict. Dagster's Job builder makes it (common labels, snake/camel conversion): the
        ``launcher`` resource provides this (``defs/resources/k8s_launcher.py``).
        """
        raise NotImplementedError
