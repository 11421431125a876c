"""What a kubelet makes of a container spec, for the local plane's node agent:
the environment (``env``, ``envFrom``, ``valueFrom`` fieldRef / secretKeyRef / configMapKeyRef,
``$(VAR)`` expansion), the "image" ``PATH``, env values under ``emptyDir`` mounts remapped into the
pod's folder, and the per-pod Linux namespaces (own hostname, PID 1, ``/etc/hosts``, ``/dev/shm``)
this host permits.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class ContainerConfigError(ValueError):
    """A reference the container's env needs is missing: the kubelet's
    ``CreateContainerConfigError`` (the pod waits, retried).
    """


def expand(value: str, env: dict[str, str]) -> str:
    """Kubelet ``$(VAR)`` expansion: ``$$`` -> ``$``; undefined references are left as written."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, value)


def image_path() -> str:
    """The "image's" ``PATH``: this checkout's interpreter first (it is what every pod runs)."""
    return f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"


def container_env(
    c: dict[str, Any],
    meta: dict[str, Any],
    base: dict[str, str],
    fields: dict[str, str],
    read: Callable[[str, str], dict[str, str] | None],
) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` of container ``c`` of a pod with metadata ``meta``: ``base`` first (the
    runtime's variables), then ``envFrom``, then ``env`` in order (each value may ``$(VAR)`` the
    ones before). ``fields`` answers ``fieldRef`` paths other than labels/annotations;
    ``read(kind, name)`` (``secret`` / ``configmap``) returns the object's data or None when it does
    not exist. Raises :class:`ContainerConfigError` for a missing, non-optional reference.
    """
    env: dict[str, str] = {"PATH": image_path(), "LANG": "C.UTF-8", **base}

    def data(kind: str, ref: dict[str, Any]) -> dict[str, str]:
        got = read(kind, ref["name"])
        if got is None:
            if ref.get("optional"):
                return {}
            raise ContainerConfigError(f'{kind} "{ref["name"]}" not found')
        return got

    for src in c.get("envFrom", []):
        prefix = src.get("prefix") or ""
        if "secretRef" in src:
            values = data("secret", src["secretRef"])
        else:
            values = data("configmap", src["configMapRef"])
        env.update({prefix + k: v for k, v in values.items()})
    for e in c.get("env", []):
        if "valueFrom" not in e:
            env[e["name"]] = expand(e.get("value", ""), env)
            continue
        src = e["valueFrom"]
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            m = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
            if m:
                env[e["name"]] = (meta.get(m[1]) or {}).get(m[2], "")
            elif path in fields:
                env[e["name"]] = fields[path] or ""
            else:
                raise ContainerConfigError(f"fieldRef {path} is not supported")
            continue
        for key, kind in (("secretKeyRef", "secret"), ("configMapKeyRef", "configmap")):
            if key in src:
                ref = src[key]
                values = data(kind, ref)
                if ref["key"] not in values:
                    if ref.get("optional"):
                        break
                    raise ContainerConfigError(f'{kind} "{ref["name"]}" has no key "{ref["key"]}"')
                env[e["name"]] = values[ref["key"]]
                break
        else:
            raise ContainerConfigError(f"valueFrom {sorted(src)} is not supported")
    argv = [expand(a, env) for a in [*c.get("command", []), *c.get("args", [])]]
    return argv, env


def remap(value: str, mounts: dict[str, Path]) -> str:
    """An env value under an ``emptyDir`` mount point (``HOME=/tmp``, ``XDG_CACHE_HOME=/cache``)
    points into the pod's own folder; an existing host path (a storage root under /tmp) is left: it
    plays the shared storage.
    """
    for mount, local in mounts.items():
        if value == mount or (value.startswith(mount + "/") and not Path(value).exists()):
            return str(local) + value[len(mount) :]
    return value


_ISOLATION_PROBE: list[str] | None | bool = False


def isolation_flags() -> list[str] | None:
    """``unshare`` flags for a pod's own UTS/PID/mount namespaces, if this host permits them
    (root or user ns).
    """
    global _ISOLATION_PROBE
    if _ISOLATION_PROBE is False:
        _ISOLATION_PROBE = None
        # FINETUNE_K8S_DOUBLE_NO_ISOLATION=1 plays a host without unshare (the agents' fallback)
        if (
            shutil.which("unshare")
            and shutil.which("hostname")
            and not os.environ.get("FINETUNE_K8S_DOUBLE_NO_ISOLATION")
        ):
            base = [
                "--uts",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--propagation",
                "private",
                "--mount-proc",
            ]
            probe = (
                "hostname probe && mount -t tmpfs -o size=1m tmpfs /dev/shm && mount --bind "
                "/dev/null /etc/hosts"
            )
            for user in ([], ["--user", "--map-root-user"]):
                flags = ["unshare", *user, *base]
                ok = (
                    subprocess.run(
                        [*flags, "sh", "-c", probe], capture_output=True, timeout=10
                    ).returncode
                    == 0
                )
                if ok:
                    _ISOLATION_PROBE = flags
                    break
    return _ISOLATION_PROBE  # type: ignore[return-value]
