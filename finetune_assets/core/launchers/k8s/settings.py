"""What derives from the launcher's fields (processes per pod, sizing, the gang's scope) and the
rules the fields must satisfy together.

The fields themselves are the ``launcher`` resource's (``defs/resources/k8s_launcher.py``: the
launchpad's ``resources.launcher.config``); this mixin reads them from ``self``.
"""

from __future__ import annotations

from typing import Any

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
    TaintEffect,
    TolerationOperator,
)
from finetune_assets.core.launchers.k8s.passthrough import refused_by_pod_security, validate


def toleration(t) -> dict[str, Any]:
    """A toleration (``key``, ``operator``, ``value``, ``effect``, ``toleration_seconds``) as the
    API's dict, unset keys left out.
    """
    out = {
        "key": t.key,
        "operator": TolerationOperator(t.operator).value,
        "value": t.value,
        "effect": TaintEffect(t.effect).value if t.effect else None,
        "tolerationSeconds": t.toleration_seconds,
    }
    return {k: v for k, v in out.items() if v is not None}


class SettingsMixin:
    """The derived half of the launcher's settings."""

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

    @property
    def gang_scope(self) -> str:
        """What, beside asset + partition, tells this deployment's Jobs from another's."""
        return f"{self.namespace}/{self.deployment}"

    def check_settings(self) -> None:
        """Refuse (ValueError) what no pod of the gang could run with, when the resource is built
        rather than when pods fail.
        """
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
        if Backend(self.backend) is Backend.JOB and self.exclusive_topology:
            raise ValueError(
                f"exclusive_topology={self.exclusive_topology!r} needs backend='jobset': an "
                "Indexed Job has no exclusive placement (the JobSet controller makes it)"
            )
        # Pods that start first wait in the rendezvous for the last one: if that wait ends before
        # the launcher's own start timeout, early pods fail holding their GPUs while the gang could
        # still form.
        if self.nnodes > 1 and self.rdzv_timeout_s < self.start_timeout_s:
            raise ValueError(
                f"rdzv_timeout_s={self.rdzv_timeout_s} is shorter than "
                f"start_timeout_s={self.start_timeout_s}: "
                "early pods would leave the rendezvous before the last pod may start; raise "
                "rdzv_timeout_s "
                "or lower start_timeout_s"
            )
