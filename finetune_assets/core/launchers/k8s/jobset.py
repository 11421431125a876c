"""The JobSet backend (``backend: jobset``): the gang as a JobSet whose controller restarts it.

The same pod template and command as the Indexed Job (``manifests.py``), wrapped as the one
replicated Job of a JobSet (``jobset.x-k8s.io/v1alpha2``, API read from sigs.k8s.io/jobset
v0.11): one child Job ``<name>-node-0`` of ``nnodes`` indexed pods, so ``JOB_COMPLETION_INDEX`` is
still the node rank and pod 0 still hosts the c10d store. What changes:

- restarts are server-side: any failed pod fails the child Job (``backoffLimit: 0``, a
  ``podFailurePolicy`` that fails it on a disruption too, instead of replacing one pod the gang
  cannot take back), and the JobSet's ``failurePolicy`` recreates the whole gang up to
  ``jobset_max_restarts`` times (``BlockingRecreate``: the old pods are gone before new ones
  start), also while the launcher is gone; a timeout or a configuration error fails it at once;
- the rendezvous Service is the JobSet's (``network.enableDNSHostnames``: a headless Service named
  after the JobSet, pod 0 at ``<name>-node-0-0.<name>.<ns>.svc``);
- each restart is its own fencing generation: the launch's generation with the restart attempt
  (``jobset.sigs.k8s.io/restart-attempt``, from the pod's labels) as its last digit;
- ``exclusive_topology`` gives the gang one topology domain to itself (the JobSet webhooks pin
  the followers to pod 0's domain and keep other JobSets out).

The launcher creates it, follows pod 0 of the current restart, says each server-side restart, and
reads the verdict from the JobSet's own terminal conditions (``Completed`` / ``Failed``) and
``status.restarts``: a failed pod is final only once no restart is left.
"""

from __future__ import annotations

import time
from typing import Any

import kubernetes

from finetune_assets.core.launchers.base import TrainingFailed, TrainingSpec
from finetune_assets.core.launchers.k8s.constants import (
    API_TIMEOUT_S,
    CONTAINER_NAME,
    JOB_LABEL,
    QUEUE_LABEL,
    PropagationPolicy,
)
from finetune_assets.core.launchers.k8s.failures import EXIT_CODE_ACTIONS, FAIL
from finetune_assets.core.launchers.k8s.logs import LogFollower
from finetune_assets.core.launchers.k8s.verdict import GangDisrupted, Verdict, assess, latest_pod
from finetune_assets.core.training.checkpoints.fencing import GENERATION_ENV

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
REPLICATED_JOB = "node"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
EXCLUSIVE_KEY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
RESTART_ENV = "FINETUNE_JOBSET_RESTART"
# exit codes that no restart can fix (failures.py: configuration errors)
NEVER_RESTARTED = sorted(c for c, (action, _) in EXIT_CODE_ACTIONS.items() if action == FAIL)


def pod0_host(name: str, namespace: str) -> str:
    """Pod 0's DNS name through the JobSet's headless Service (subdomain = the JobSet's name)."""
    return f"{name}-{REPLICATED_JOB}-0-0.{name}.{namespace}.svc"


def child_job(name: str) -> str:
    return f"{name}-{REPLICATED_JOB}-0"


def to_jobset(job: dict[str, Any], max_restarts: int, exclusive_topology: str | None) -> dict:
    """The rendered Indexed Job as the one replicated Job of a JobSet (see the module docstring).

    The Kueue queue label goes on the JobSet only (Kueue's JobSet integration admits it whole; on
    the child Job its batch/job integration would queue the Job on its own).
    """
    meta, spec = job["metadata"], dict(job["spec"])
    ttl = spec.pop("ttlSecondsAfterFinished", None)
    suspend = spec.pop("suspend", None)
    template = dict(spec["template"])
    pod_meta = dict(template["metadata"])
    pod_meta["labels"] = {k: v for k, v in pod_meta.get("labels", {}).items() if k != QUEUE_LABEL}
    template["metadata"] = pod_meta
    spec["template"] = template
    rules = [
        {  # configuration errors: failJob, and the JobSet fails on them (below)
            "action": "FailJob",
            "onExitCodes": {
                "containerName": CONTAINER_NAME,
                "operator": "In",
                "values": NEVER_RESTARTED,
            },
        },
        # a disrupted pod fails the child Job too: the JobSet restarts the whole gang
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "NotIn", "values": [0]},
        },
    ]
    spec["podFailurePolicy"] = {"rules": rules}
    codes = "|".join(str(c) for c in NEVER_RESTARTED)
    labels = dict(meta.get("labels", {}))
    out: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": labels},
        "spec": {
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": 1,
                    "template": {
                        "metadata": {
                            "labels": {k: v for k, v in labels.items() if k != QUEUE_LABEL}
                        },
                        "spec": spec,
                    },
                }
            ],
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All"},
            "failurePolicy": {
                "maxRestarts": max_restarts,
                "restartStrategy": "BlockingRecreate",
                # first match wins; no match: RestartJobSet (counted against maxRestarts)
                "rules": [
                    {
                        "name": "timedOut",
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["DeadlineExceeded"],
                    },
                    {
                        "name": "configurationError",
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                        # the Job controller's message for an exit-code rule
                        "onJobFailureMessagePatterns": [f"failed with exit code ({codes}) "],
                    },
                ],
            },
        },
    }
    if ttl is not None:
        out["spec"]["ttlSecondsAfterFinished"] = ttl
    if suspend:
        out["spec"]["suspend"] = True
    if exclusive_topology:
        out["metadata"]["annotations"] = {EXCLUSIVE_KEY: exclusive_topology}
    return out


def restart_generation(container: dict[str, Any], generation: int) -> None:
    """Make ``GENERATION_ENV`` ``<generation><restart attempt>``: larger for every restart of this
    JobSet (at most 9, one digit) and for every later launch (a larger ``generation``).
    """
    env = [e for e in container["env"] if e["name"] != GENERATION_ENV]
    env += [
        {
            "name": RESTART_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{RESTART_LABEL}']"}},
        },
        {"name": GENERATION_ENV, "value": f"{generation}$({RESTART_ENV})"},
    ]
    container["env"] = env


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The JobSet's true conditions, by type."""
    items = ((obj or {}).get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in items if c.get("status") == "True"}


def assess_jobset(obj: dict[str, Any], pods, nnodes: int, max_restarts: int) -> Verdict:
    """What the gang is doing, from the JobSet and the pods of its current restart.

    The JobSet's terminal conditions decide; a failed or disrupted pod is ``restarting`` while
    restarts are left (the controller recreates the gang) and ``failed`` only once none is (fail
    fast: the controller's ``Failed`` follows). A pod over its own size limit fails at once, as
    with the Job backend: every restart would be evicted the same way.
    """
    conds = conditions(obj)
    if "Failed" in conds:
        c = conds["Failed"]
        return Verdict("failed", f"JobSet failed: {c.get('reason')}: {c.get('message')}", "Failed")
    if "Completed" in conds:
        return Verdict("complete", f"all {nnodes} pod(s) succeeded")
    if "Suspended" in conds:
        c = conds["Suspended"]
        return Verdict("queued", f"JobSet suspended ({c.get('reason')}), waiting for admission")
    verdict = assess(None, pods, nnodes)
    restartable = verdict.kind == "disrupted" or (
        verdict.kind == "failed" and verdict.why == "pod(s) failed"
    )
    if not restartable:
        return verdict
    used = ((obj.get("status") or {}).get("restartsCountTowardsMax")) or 0
    if used < max_restarts:
        return Verdict("restarting", verdict.why)
    return Verdict("failed", f"{verdict.why}; no JobSet restart left (maxRestarts={max_restarts})")


class JobSetMixin:
    """The JobSet half of the launcher."""

    def render_jobset(
        self, job: TrainingSpec, name: str, image: str | None = None, generation: int | None = None
    ) -> dict[str, Any]:
        _, job_dict = self.render(job, name, image, generation)
        if generation is not None:
            restart_generation(job_dict["spec"]["template"]["spec"]["containers"][0], generation)
        return to_jobset(job_dict, self.jobset_max_restarts, self.exclusive_topology)

    def _run_jobset(self, log, api, job: TrainingSpec, owner, image: str | None) -> None:
        from finetune_assets.core.launchers.k8s.manifests import k8s_name

        name, ns = k8s_name(job.name), self.namespace
        manifest = self.render_jobset(job, name, image, generation=time.time_ns())
        if owner is not None:
            manifest["metadata"]["ownerReferences"] = [owner]
        log.info(
            f"Launching training JobSet {ns}/{name}: {self.nnodes} pod(s) x {self.processes} "
            f"process(es), up to {self.jobset_max_restarts} server-side restart(s), image "
            f"{image}, command: {' '.join(self.command(job, name))}"
        )
        follower: LogFollower | None = None
        try:
            api.custom_api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
            follower = LogFollower(api, ns)
            self._supervise_jobset(log, api, name, follower)
        finally:
            self._cleanup_jobset(log, api, name)
            if follower is not None:
                follower.stop()
                follower.drain(log)

    def _supervise_jobset(self, log, api, name: str, follower: LogFollower) -> None:
        ns = self.namespace
        now = time.monotonic()
        deadline, start_deadline = now + self.timeout_s, now + self.start_timeout_s
        queue_deadline = now + self.queue_timeout_s
        seen_restarts, started, last_note = 0, False, ""
        while True:
            follower.drain(log)
            obj = api.custom_api.get_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, _request_timeout=API_TIMEOUT_S
            )
            restarts = (obj.get("status") or {}).get("restarts") or 0
            pods = api.core_api.list_namespaced_pod(
                ns,
                label_selector=f"{JOB_LABEL}={name},{RESTART_LABEL}={restarts}",
                _request_timeout=API_TIMEOUT_S,
            ).items
            pod0 = latest_pod(pods, 0)
            if pod0 is not None and pod0.status and pod0.status.phase != "Pending":
                follower.start(pod0.metadata.name)
            now = time.monotonic()
            if restarts > seen_restarts:
                log.warning(
                    f"Training JobSet {ns}/{name}: the JobSet controller restarted the gang "
                    f"(restart {restarts} of at most {self.jobset_max_restarts}); the new pods "
                    "resume from the last checkpoint"
                )
                seen_restarts, started = restarts, False
                start_deadline = now + self.start_timeout_s
            verdict = assess_jobset(obj, pods, self.nnodes, self.jobset_max_restarts)
            if verdict.kind == "complete":
                follower.finish(pod0.metadata.name if pod0 is not None else None, log)
                log.info(f"Training JobSet {ns}/{name}: {verdict.why}")
                return
            if verdict.kind in ("failed", "stuck"):
                self._fail_jobset(log, api, name, pods, verdict.why, restarts)
            if verdict.kind == "queued":
                if now > queue_deadline:
                    self._fail_jobset(log, api, name, pods, verdict.why, restarts)
                deadline, start_deadline = now + self.timeout_s, now + self.start_timeout_s
            started = started or verdict.kind == "running"
            note = f"{verdict.kind}: {verdict.why}" if verdict.why else ""
            if note and note != last_note:
                trouble = verdict.kind in ("restarting",) or "Unschedulable" in note
                (log.warning if trouble else log.info)(f"Training JobSet {ns}/{name}: {note}")
            last_note = note
            if not started and verdict.kind == "waiting" and now > start_deadline:
                self._fail_jobset(
                    log,
                    api,
                    name,
                    pods,
                    f"pods did not all start within start_timeout_s={self.start_timeout_s}: "
                    f"{verdict.why}",
                    restarts,
                )
            if now > deadline:
                self._fail_jobset(
                    log, api, name, pods, f"timed out after {self.timeout_s}s", restarts
                )
            time.sleep(self.poll_interval_s)

    def _fail_jobset(self, log, api, name: str, pods, why: str, restarts: int) -> None:
        """Classified as the Job backend does (``_fail``), but never resubmitted by the launcher:
        the JobSet's server-side restarts were its retries.
        """
        try:
            self._fail(log, api, name, pods, why)
        except GangDisrupted as e:
            raise TrainingFailed(
                f"{e}; the JobSet restarted the gang {restarts} time(s) "
                f"(jobset_max_restarts={self.jobset_max_restarts}), none is left"
            ) from None

    def _cleanup_jobset(self, log, api, name: str) -> None:
        """Delete the JobSet (its child Job, pods and Service go with it); if that keeps failing,
        suspend it (the controller then suspends the child Job, freeing the pods' resources).
        """
        ns = self.namespace
        body = kubernetes.client.V1DeleteOptions(
            propagation_policy=PropagationPolicy(self.delete_propagation_policy).value
        )
        try:
            api.custom_api.delete_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, body=body
            )
            log.info(f"Deleted JobSet {ns}/{name}")
            return
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return
            error: Exception = e
        except Exception as e:
            error = e
        try:
            api.custom_api.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, {"spec": {"suspend": True}}
            )
        except Exception as e:
            log.error(
                f"Could not delete JobSet {ns}/{name} ({error!r}) nor suspend it ({e!r}): its "
                f"pods ({JOB_LABEL}={name}) are LEFT RUNNING; remove them with "
                f"`kubectl delete jobset -n {ns} {name}`"
            )
            return
        log.warning(
            f"Could not delete JobSet {ns}/{name} ({error!r}); suspended it instead (no pods, "
            f"no resources): remove it with `kubectl delete jobset -n {ns} {name}`"
        )
