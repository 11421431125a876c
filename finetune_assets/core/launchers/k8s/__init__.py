"""Run the training command as multi-node torchrun pods on Kubernetes (an Indexed Job + headless
Service).

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

So we build on one piece under ``dagster_k8s.execute_k8s_job``: ``construct_dagster_k8s_job``
(Dagster's Job manifest builder: common labels, label sanitizing, snake/camel model conversion),
called by the ``launcher`` resource (``defs/resources/k8s_launcher.py``: this package is
Dagster-free, the resource holds the fields and mixes in :class:`K8sLauncher`); the API client is
the ``kubernetes`` client's own, with retries (``api.py``). We do *not* call ``execute_k8s_job``:
it creates no Service, streams logs from whichever pod lists first (not rank 0), and with
``parallelism > 1`` waits until no pod is active, so one dead rank with hung peers would hang until
the timeout. Here the supervision loop streams the index-0 pod, fails as soon as any pod fails
(copying every pod's log tail and the Warning Events into the run's log and the error), says why
pods wait (scheduler, quota/admission, image pulls) and bounds that wait, resubmits a fresh gang
that resumes from the checkpoint when a pod is disrupted (``DisruptionTarget``: eviction,
preemption, node lost), and always deletes the Job and the Service (success, failure, timeout,
interruption). Owner references (launching pod -> Job -> Service) let Kubernetes delete the gang
when this process dies with its pod; the next attempt deletes any live gang of the same asset +
partition. Pod 0 hosts the c10d store unconditionally (:func:`pod0_hosts_the_store`).

JobSet (``jobset.py``, ``backend: jobset``): the same pods as the one replicated Job of a JobSet,
whose controller restarts the whole gang server-side (``jobset_max_restarts``) and can place it
exclusively in one topology domain; the launcher then reads the JobSet's conditions and restarts
instead of resubmitting (deploy/README.md: when to pick which).

Kueue (``kueue.py``): a preempted gang is the same Job re-admitted later; the launcher names the
preemption, waits, and the new pods resume from the checkpoint; a Job it cannot delete is stopped by
deactivating its Workload (Kueue would un-suspend a suspended one). Gangs never overlap: a new gang
starts only when no unfinished pod of the gang key is left, and a stale rank that outlives its gang
anyway is fenced off its checkpoint commits (``core/training/checkpoints/fencing.py``). Failures
are classified by evidence (``failures.py``): transient infrastructure is resubmitted within
``max_resubmissions``, configuration and code fail at once; a pod given GPUs that sees no CUDA
exits 78 first (``finetune_assets/core/training/cuda_preflight.py``).

Security: pods run non-root with a read-only root filesystem (writable emptyDirs for ``/tmp``,
caches and ``/dev/shm``), no privilege escalation, all capabilities dropped, the RuntimeDefault
seccomp profile, no service-account token, and resource limits (Guaranteed QoS by default): they
pass Pod Security ``restricted``, which ``deploy/namespace.yaml`` enforces; what the namespace's
level would refuse (``pod_security_level``) is refused when the resource is built. Credentials
reach the pods only as ``envFrom`` references to Kubernetes Secrets by *name*; this process never
reads or renders their values, and plain ``env`` entries that look like credentials are refused.
"""

from finetune_assets.core.launchers.k8s.constants import (
    API_TIMEOUT_S,
    CONTAINER_NAME,
    GANG_LABEL,
    JOB_LABEL,
    Backend,
    PropagationPolicy,
    PullPolicy,
)
from finetune_assets.core.launchers.k8s.launcher import K8sLauncher
from finetune_assets.core.launchers.k8s.logs import LogFollower
from finetune_assets.core.launchers.k8s.manifests import (
    gang_key,
    k8s_name,
    pod0_hosts_the_store,
    sanitize_label_value,
)
from finetune_assets.core.launchers.k8s.verdict import (
    GangDisrupted,
    Verdict,
    assess,
    job_conditions,
    latest_pod,
)

__all__ = [
    "API_TIMEOUT_S",
    "CONTAINER_NAME",
    "Backend",
    "GANG_LABEL",
    "JOB_LABEL",
    "GangDisrupted",
    "K8sLauncher",
    "LogFollower",
    "PropagationPolicy",
    "PullPolicy",
    "Verdict",
    "assess",
    "gang_key",
    "job_conditions",
    "k8s_name",
    "latest_pod",
    "pod0_hosts_the_store",
    "sanitize_label_value",
]
