"""The pod-template passthrough: what the typed settings do not cover, in dagster-k8s's own shape.

``k8s_config`` takes the keys of dagster-k8s's ``UserDefinedDagsterK8sConfig`` (the
``dagster-k8s/config`` tag): ``container_config``, ``pod_spec_config``,
``pod_template_spec_metadata``, ``job_spec_config``, ``job_metadata``, in the API's camelCase. It
is deep-merged into what the launcher renders (mappings merge key by key, lists are appended,
other values replace), e.g.
annotations (``karpenter.sh/do-not-disrupt``), ``priorityClassName``, ``schedulerName``, affinity
and topology spread, ``runtimeClassName``, extra device resources (RDMA, EFA). Fields the gang's
correctness rests on are refused, and so are credentials as plain ``env`` values.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from finetune_assets.core.launchers.k8s.constants import _SECRET_ENV

KEYS = (
    "container_config",
    "pod_spec_config",
    "pod_template_spec_metadata",
    "job_spec_config",
    "job_metadata",
)
# Set by the launcher for the gang / fan-out to work (or to stay safe): not overridable.
PROTECTED = {
    "job_spec_config": {
        "completionMode",
        "completions",
        "parallelism",
        "backoffLimit",
        "backoffLimitPerIndex",
        "maxFailedIndexes",
        "podFailurePolicy",
        "activeDeadlineSeconds",
        "suspend",
        "selector",
        "template",
    },
    "pod_spec_config": {
        "containers",
        "restartPolicy",
        "subdomain",
        "hostname",
        "automountServiceAccountToken",
        "hostNetwork",  # the typed host_network setting (checked against pod_security_level)
        "hostPID",
        "hostIPC",
    },
    "container_config": {"name", "command", "args", "image"},
}


def validate(config: Mapping[str, Any], where: str = "k8s_config") -> None:
    """Refuse unknown keys, non-mapping sections, protected fields and plain-text credentials."""
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected some of {list(KEYS)}")
    for key, section in config.items():
        if not isinstance(section, Mapping):
            raise ValueError(f"{where}.{key} must be a mapping, got {type(section).__name__}")
        taken = sorted(set(section) & PROTECTED.get(key, set()))
        if taken:
            raise ValueError(
                f"{where}.{key}: {taken} are set by the launcher (the gang relies on them)"
            )
    for env in (config.get("container_config") or {}).get("env") or []:
        if "value" in env and _SECRET_ENV.search(env.get("name", "")):
            raise ValueError(
                f"{where}: env {env['name']!r} looks like a credential; use env_secret_names"
            )
    sc = (config.get("container_config") or {}).get("securityContext") or {}
    if sc.get("privileged") or sc.get("allowPrivilegeEscalation"):
        raise ValueError(f"{where}: privileged containers / privilege escalation are not allowed")


# Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards): the
# capabilities each level lets a container add.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
ADDABLE_CAPABILITIES = {"restricted": {"NET_BIND_SERVICE"}, "baseline": BASELINE_CAPABILITIES}


def refused_by_pod_security(config: Mapping[str, Any], level: str) -> str | None:
    """What in a passthrough (or the typed host_network) the Pod Security ``level`` refuses, or
    None: host namespaces, hostPath volumes, added capabilities beyond the level's list.
    """
    if level == "privileged":
        return None
    pod = config.get("pod_spec_config") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            return f"{key}: true (host namespaces)"
    host_paths = [v.get("name") for v in pod.get("volumes") or [] if "hostPath" in v]
    if host_paths:
        return f"hostPath volume(s) {host_paths}"
    sc = (config.get("container_config") or {}).get("securityContext") or {}
    added = set((sc.get("capabilities") or {}).get("add") or [])
    beyond = sorted(added - ADDABLE_CAPABILITIES[level])
    if beyond:
        return f"capabilities.add {beyond}"
    return None


def deep_merge(base: Any, extra: Any) -> Any:
    """``extra`` over ``base``: mappings merge by key, lists are appended, other values replace."""
    if isinstance(base, Mapping) and isinstance(extra, Mapping):
        out = dict(base)
        for key, value in extra.items():
            out[key] = deep_merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(extra, list):
        return [*base, *copy.deepcopy(extra)]
    return copy.deepcopy(extra)
