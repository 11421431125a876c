"""The launcher's constants and enums: names and labels every module shares, the pod
environment, the "auto" sizing per process, and the choices a field offers (the fields themselves
are the Dagster resource's, ``defs/resources/k8s_launcher.py``).
"""

from __future__ import annotations

import re
from enum import Enum

CONTAINER_NAME = "trainer"
# Our own pod label: the Service selector and every pod query use it (the controller's `job-name`
# label is not set by every Job implementation, e.g. older clusters or API doubles).
JOB_LABEL = "finetune-assets/training-job"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
COMPONENT = "finetune-trainer"
# One value per asset + partition on every Job: finds a live gang left by a dead launcher (see
# gang_key).
GANG_LABEL = "finetune-assets/gang"
DEPLOYMENT_LABEL = "finetune-assets/deployment"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
EVENTS_EVERY_S = 5.0
API_TIMEOUT_S = (
    30  # every API read is bounded: a hung connection must not hang the supervision loop
)
# Environment names that must come from a Kubernetes Secret, never from a plain `env` value
# (TOKENIZERS_PARALLELISM, which the data fan-out sets on every worker, is a switch, not a token).
_SECRET_ENV = re.compile(
    r"(PASSWORD|PASSWD|SECRET|TOKEN(?!IZER)|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL|API_KEY)", re.I
)
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
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
    # A replaced pod's torchrun agent cannot rejoin the rendezvous' shared TCP store in torch 2.x
    # (it waits for a MASTER_ADDR the node-0 agent never republishes): give each round its own store
    # instead.
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
}


# Resource sizing per process when a field is "auto" (an 8-GPU pod gets 8x, /dev/shm on top of
# memory).
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


class PodSecurityLevel(str, Enum):
    """The Pod Security Standard the namespace enforces (its pod-security.kubernetes.io/enforce
    label).
    """

    RESTRICTED = "restricted"
    BASELINE = "baseline"
    PRIVILEGED = "privileged"


class Backend(str, Enum):
    """What runs the gang: an Indexed Job the launcher supervises and resubmits (``job``), or a
    JobSet whose controller restarts the whole gang server-side (``jobset``; deploy/README.md
    says when to pick which).
    """

    JOB = "job"
    JOBSET = "jobset"


class PropagationPolicy(str, Enum):
    BACKGROUND = "Background"
    FOREGROUND = "Foreground"
