"""Kueue, read and steered the way Kueue itself works (not through ``spec.suspend``).

Kueue owns a queued Job's ``suspend`` field: it un-suspends the Job when it admits its Workload
and suspends it again when it preempts it, so a launcher that suspends a Kueue-managed Job to stop
it is overruled at the next admission. The Kueue way to stop a Job without deleting it is to
deactivate its Workload (``spec.active: false``; Kueue then evicts and suspends it for good).
Preemption is a Kueue eviction: the Job controller deletes the pods (SIGTERM, no
``DisruptionTarget``), and the same Job is admitted again later; the Workload's ``Evicted``
condition says why.

Verified on the local plane (Kubernetes v1.36.3, Kueue v0.17.0, ``test_kueue_plane.py``): the pods
a suspension deletes are not counted by the Job's ``podFailurePolicy`` (a ``FailJob`` rule on any
non-zero exit does not fail the suspended Job, even when the pods take seconds to exit), and Kueue
re-admits only after the old pods are gone.
"""

from __future__ import annotations

from typing import Any

import kubernetes

GROUP, VERSION, PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def workload_of(api, namespace: str, job_uid: str) -> dict[str, Any] | None:
    """The Workload Kueue made for the Job (by its ``job-uid`` label), or None (not readable)."""
    custom = getattr(api, "custom_api", None)
    if custom is None or not job_uid:
        return None
    try:
        items = custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, label_selector=f"{JOB_UID_LABEL}={job_uid}"
        )["items"]
    except kubernetes.client.ApiException as e:
        if e.status in (403, 404):  # no RBAC for Workloads, or no Kueue: say less, go on
            return None
        raise
    return items[0] if items else None


def eviction(workload: dict[str, Any] | None) -> str | None:
    """Why Kueue evicted the Workload (``Evicted`` / ``Preempted`` conditions), or None."""
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    for kind in ("Preempted", "Evicted"):
        for c in conditions:
            if c.get("type") == kind and c.get("status") == "True":
                return f"{c.get('reason') or kind}: {c.get('message') or ''}".rstrip(": ")
    return None


def deactivate(api, namespace: str, workload: dict[str, Any]) -> None:
    """``spec.active: false``: Kueue evicts the Workload and keeps its Job suspended."""
    api.custom_api.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, workload["metadata"]["name"], {"spec": {"active": False}}
    )
