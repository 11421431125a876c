"""Kubelet and runtime faults the node agents play, as a test asks for them in a per-plane file.

A real kubelet starts a pod late (a slow image pull), rejects it at admission (a device plugin that
restarted), evicts it under node pressure, fails to pull an image that does not exist; a real
cluster DNS answers a new pod's name a while after the pod runs. Only the node agent (the faked
container runtime and kubelet) can make these happen on the local plane, so a test writes what it
wants into ``DIR/node-faults.json`` (:func:`plane.node_faults`) and the agents of that plane act on
it, reporting each fault with the status fields, reasons, messages and Events the kubelet of
Kubernetes v1.36 writes (the source is named beside each message below). Nothing is monkeypatched:
the launcher sees the API server's objects only.

The file::

    {"rules": [{"fault": "start_delay" | "admission_error" | "evict",
                "namespace": "...", "labels": {"k": "v"},   # which pods (all given must match)
                "times": 1,                                 # how many pods it hits (null: all)
                "seconds": 3.0,                             # start_delay only
                "resource": "memory"}],                     # evict only
     "dns_lag_s": 10.0,                 # a ready endpoint's name resolves this long after it is
     "missing_images": ["registry/x:y"]} # images the registry does not have

Rules are consumed under a lock shared by the agents of the plane, so ``times`` holds across nodes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

FAULTS = ("start_delay", "admission_error", "evict")

# pkg/kubelet/cm/admission/errors.go (unexpectedAdmissionError) around the device manager's error
# (pkg/kubelet/cm/devicemanager/manager.go); kubelet.go rejectPod prefixes "Pod was rejected: "
ADMISSION_REASON = "UnexpectedAdmissionError"
ADMISSION_MESSAGE = (
    "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
    "nvidia.com/gpu, which is unexpected"
)
# pkg/kubelet/eviction/helpers.go: Reason, nodeLowMessageFmt, thresholdMetMessageFmt,
# containerMessageFmt; eviction_manager.go: the DisruptionTarget condition (TerminationByKubelet)
EVICTION_REASON = "Evicted"
EVICTION_CONDITION_REASON = "TerminationByKubelet"
EVICTION_GRACE_S = 1  # immediateEvictionGracePeriodSeconds (a hard threshold)


def eviction_message(resource: str, container: str, request: str) -> str:
    """What the eviction manager writes for a pod evicted to reclaim ``resource``."""
    return (
        f"The node was low on resource: {resource}. Threshold quantity: 100Mi, available: 48Mi. "
        f"Container {container} was using 1843Mi, request is {request}, has larger consumption "
        f"of {resource}. "
    )


def normalized_image(image: str) -> str:
    """The reference containerd pulls (``docker.io/library/`` for a bare name, ``:latest``)."""
    first, _, rest = image.partition("/")
    if not rest:
        image = f"docker.io/library/{image}"
    elif "." not in first and ":" not in first and first != "localhost":
        image = f"docker.io/{image}"
    last = image.rsplit("/", 1)[-1]
    return image if ":" in last or "@" in last else f"{image}:latest"


def pull_error(image: str) -> str:
    """The CRI error containerd returns for a tag its registry does not have (the kubelet puts it
    in ``waiting.message`` of ``ErrImagePull``, pkg/kubelet/images/image_manager.go).
    """
    ref = normalized_image(image)
    return (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{ref}": '
        f'failed to resolve reference "{ref}": {ref}: not found'
    )


class FaultFile:
    """The plane's fault file as one agent reads it (``path`` need not exist: no faults)."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any] | None]:
        if self.path is None:
            yield None
            return
        lock = self.path.with_name(self.path.name + ".lock")
        with open(lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            try:
                data = json.loads(self.path.read_text()) if self.path.exists() else None
            except (OSError, ValueError):
                data = None
            yield data

    def read(self) -> dict[str, Any]:
        with self._locked() as data:
            return data or {}

    def take(self, fault: str, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The first rule of kind ``fault`` matching ``pod`` that has hits left, counted down."""
        with self._locked() as data:
            if not data:
                return None
            for rule in data.get("rules") or []:
                if rule.get("fault") != fault or not matches(rule, pod):
                    continue
                if rule.get("times") is not None:
                    if rule["times"] <= 0:
                        continue
                    rule["times"] -= 1
                    tmp = self.path.with_name(self.path.name + ".tmp")
                    tmp.write_text(json.dumps(data))
                    tmp.replace(self.path)
                return rule
        return None


def matches(rule: dict[str, Any], pod: dict[str, Any]) -> bool:
    meta = pod["metadata"]
    if rule.get("namespace") and rule["namespace"] != meta.get("namespace"):
        return False
    labels = meta.get("labels") or {}
    return all(labels.get(k) == v for k, v in (rule.get("labels") or {}).items())


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """``change`` the plane's faults in place (read, change, replace atomically, under the agents'
    lock: a count an agent took meanwhile is kept).
    """
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            faults = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            faults = {}
        change(faults)
        for rule in faults.get("rules") or []:
            if rule.get("fault") not in FAULTS:
                raise ValueError(
                    f"unknown node fault {rule.get('fault')!r}: expected one of {FAULTS}"
                )
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(faults))
        tmp.replace(path)
