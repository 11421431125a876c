"""The launcher: launch a gang, resubmit it after a disruption, remove what a dead launcher left.

Dagster-free: :class:`K8sLauncher` reads its fields from ``self``, and the ``launcher`` resource
(``defs/resources/k8s_launcher.py``) that holds them mixes it in; the run comes as a
:class:`~finetune_assets.core.launchers.base.RunContext`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import kubernetes
import yaml

from finetune_assets.core.launchers.base import RunContext, TrainingFailed, TrainingSpec
from finetune_assets.core.launchers.k8s import kueue
from finetune_assets.core.launchers.k8s.api import ApiMixin
from finetune_assets.core.launchers.k8s.constants import (
    API_TIMEOUT_S,
    GANG_LABEL,
    JOB_LABEL,
    Backend,
    PropagationPolicy,
)
from finetune_assets.core.launchers.k8s.jobset import JobSetMixin
from finetune_assets.core.launchers.k8s.logs import LogFollower
from finetune_assets.core.launchers.k8s.manifests import ManifestsMixin, gang_key, k8s_name
from finetune_assets.core.launchers.k8s.runs import LiveRunConflict, TakeoverMixin
from finetune_assets.core.launchers.k8s.settings import SettingsMixin
from finetune_assets.core.launchers.k8s.supervise import SupervisionMixin
from finetune_assets.core.launchers.k8s.verdict import GangDisrupted, VanishedPods, assess


class K8sLauncher(
    JobSetMixin, SupervisionMixin, ManifestsMixin, TakeoverMixin, ApiMixin, SettingsMixin
):
    """Runs the torchrun command as ``nnodes`` pods of an Indexed Job (or of a JobSet's one
    Indexed Job: ``backend``) with c10d rendezvous on pod 0.
    """

    def train(self, ctx: RunContext, job: TrainingSpec) -> None:
        """Run ``job`` to completion or raise :class:`TrainingFailed`; the gang is deleted however
        it ends.
        """
        log = ctx.log
        api = self.api(log)
        owner, owner_image = self._owner_reference(log, api)
        image = self.image or owner_image
        key = gang_key(job.labels, self.gang_scope)
        if key is not None:  # an asset + partition: no other gang of it may run
            try:
                self._remove_live_gangs(log, api, key, run_state=ctx.run_state, own_run=ctx.run_id)
            except LiveRunConflict as e:
                raise TrainingFailed(str(e)) from None
        for attempt in range(self.max_resubmissions + 1):
            try:
                self._run_gang(log, api, job, owner, image)
                return
            except GangDisrupted as e:
                if attempt >= self.max_resubmissions:
                    raise TrainingFailed(
                        f"{e}; the gang was disrupted {attempt + 1} time(s), more than "
                        "max_resubmissions="
                        f"{self.max_resubmissions}"
                    ) from None
                log.warning(
                    f"{e}: resubmitting the gang ({attempt + 1}/{self.max_resubmissions}); "
                    "the trainer resumes from its last checkpoint"
                )

    def _run_gang(
        self, log, api, job: TrainingSpec, owner: dict[str, Any] | None, image: str | None
    ) -> None:
        if Backend(self.backend) is Backend.JOBSET:  # restarts are the JobSet controller's
            self._run_jobset(log, api, job, owner, image)
            return
        name = k8s_name(job.name)
        # strictly larger for every new gang: a stale gang's rank can no longer commit
        service, manifest = self.render(job, name, image, generation=time.time_ns())
        log.info(
            f"Launching training Job {self.namespace}/{name}: {self.nnodes} pod(s) x "
            f"{self.processes} "
            f"process(es), image {image}, command: {' '.join(self.command(job, name))}"
        )
        self.run_job(
            log,
            api,
            manifest,
            owner,
            service=service,
            what="Training Job",
            assess_fn=lambda status, pods: assess(status, pods, self.nnodes),
            fail_fn=lambda status, pods, why: self._fail(log, api, name, pods, why),
            vanished=VanishedPods(),
        )

    def run_job(
        self,
        log,
        api,
        manifest: dict[str, Any],
        owner: dict[str, Any] | None,
        *,
        what: str,
        assess_fn,
        fail_fn,
        service: dict[str, Any] | None = None,
        progress=None,
        pod_fields: str | None = None,
        vanished: VanishedPods | None = None,
    ) -> None:
        """One Job (+ Service): create, supervise (see :meth:`_supervise`), always delete.

        Shared by the training gang and the data fan-out (``k8s_fanout.py``): they differ only in
        the manifest, the verdict (``assess_fn``), the error (``fail_fn``) and the per-poll
        ``progress`` report.
        """
        name, ns = manifest["metadata"]["name"], self.namespace
        # the launching pod dies -> Kubernetes' garbage collector deletes the Job
        if owner is not None:
            manifest["metadata"]["ownerReferences"] = [owner]
        # Names of Secrets only; the manifest carries no secret values by construction.
        log.debug(
            "Rendered manifests:\n"
            + yaml.safe_dump_all([m for m in (service, manifest) if m], sort_keys=False)
        )
        follower: LogFollower | None = None
        try:
            api.batch_api.create_namespaced_job(ns, manifest)
            if service is not None:
                uid = api.batch_api.read_namespaced_job(name, ns).metadata.uid
                # goes with the Job
                service["metadata"]["ownerReferences"] = [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}
                ]
                api.core_api.create_namespaced_service(ns, service)
            follower = LogFollower(api, ns)
            self._supervise(
                log, api, name, follower, what, assess_fn, fail_fn, progress, pod_fields, vanished
            )
        except GangDisrupted:
            # The old pods must be gone before a new gang starts: they hold the GPUs, and their rank
            # 0 could still write a checkpoint while the new gang loads it.
            self._cleanup(log, api, name, service is not None)
            gang = manifest["metadata"].get("labels", {}).get(GANG_LABEL)
            self._wait_pods_gone(
                log, api, f"{GANG_LABEL}={gang}" if gang else f"{JOB_LABEL}={name}"
            )
            raise
        finally:
            # Delete first: whatever interrupted us (failure, timeout, run termination) must not
            # keep the pods alive. Deleting the pods also ends the follow stream of the log thread.
            self._cleanup(log, api, name, service is not None)
            if follower is not None:
                follower.stop()
                follower.drain(log)  # pod 0's last lines before the failure or interruption

    def _wait_pods_gone(self, log, api, selector: str) -> None:
        """Until no unfinished pod matches ``selector`` (a gang's label: every pod of every Job of
        it, also of Jobs already gone), so an old and a new gang never run at once.

        A pod on a node that lost contact stays (``Terminating``) until the node is confirmed gone:
        deleted by its cloud's node controller, or tainted ``node.kubernetes.io/out-of-service`` by
        an admin after shutting it down (non-graceful node shutdown; PodGC then removes the pods).
        The launcher does not force-delete pods itself (the node could still be running them):
        it says so, waits up to ``gone_timeout_s`` and then refuses to start a new gang.
        """
        deadline = time.monotonic() + self.gone_timeout_s
        said = ""
        while True:
            left = [
                p
                for p in api.core_api.list_namespaced_pod(
                    self.namespace, label_selector=selector, _request_timeout=API_TIMEOUT_S
                ).items
                if not (p.status and p.status.phase in ("Succeeded", "Failed"))
            ]
            if not left:
                return
            lost = self._on_lost_nodes(left)
            if lost and lost != said:
                log.error(
                    f"Pods {lost} are still not confirmed gone by their nodes (NotReady or "
                    "Unknown?): Kubernetes cannot tell they stopped, and a new gang would overlap "
                    "them. If a node is shut down, taint it: `kubectl taint nodes NODE "
                    "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` (PodGC then "
                    "removes its pods); waiting"
                )
                said = lost
            if time.monotonic() > deadline:
                names = ", ".join(p.metadata.name for p in left)
                raise TrainingFailed(
                    f"pods of the previous gang ({selector}: {names}) are still not gone after "
                    f"gone_timeout_s={self.gone_timeout_s}s; a new gang is not started while "
                    "they may still run (two gangs would write one checkpoint). "
                    + (f"Lost nodes: {lost}. " if lost else "")
                    + "Remove them (see the log), then launch again"
                )
            time.sleep(self.poll_interval_s)

    @staticmethod
    def _on_lost_nodes(pods) -> str:
        """``pod@node`` for pods whose deletion their node has not confirmed well past the grace
        period (the node does not report: NotReady / Unknown), as one string. From the pods alone:
        the launcher's RBAC has no access to Nodes (cluster-scoped).
        """
        import datetime

        now = datetime.datetime.now(datetime.UTC)
        out = []
        for p in pods:
            gone_at = p.metadata.deletion_timestamp
            grace = (p.spec.termination_grace_period_seconds or 30) if p.spec else 30
            if gone_at is not None and (now - gone_at).total_seconds() > grace + 15:
                out.append(f"{p.metadata.name}@{(p.spec.node_name if p.spec else None) or '?'}")
        return ", ".join(out)

    def _owner_reference(self, log, api) -> tuple[dict[str, Any] | None, str | None]:
        """The launching pod as owner of the Job (in-cluster: $HOSTNAME, the pod name; dagster-k8s
        does the same), and its image.
        """
        name = self.owner_pod or (
            os.environ.get("HOSTNAME") if self.load_incluster_config else None
        )
        if not name:
            return None, None
        try:
            pod = api.core_api.read_namespaced_pod(name, self.namespace)
        except kubernetes.client.ApiException as e:
            log.warning(
                f"Cannot read the launching pod {self.namespace}/{name} ({e.status} {e.reason}): "
                "the training "
                "Job gets no owner; if this process dies, only its TTL and the next launch "
                "remove it"
            )
            return None, None
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": name,
            "uid": pod.metadata.uid,
        }, self._own_image(log, pod)

    def _own_image(self, log, pod) -> str | None:
        """The launching container's image, by name (a mesh proxy or other sidecar may come
        first).
        """
        containers = list(pod.spec.containers or []) if pod.spec else []
        named = [c for c in containers if c.name == self.owner_container]
        if named or len(containers) == 1:
            return (named or containers)[0].image
        log.warning(
            f"The launching pod {self.namespace}/{pod.metadata.name} has no container named "
            f"{self.owner_container!r} (it has {[c.name for c in containers]}): set "
            "owner_container or image"
        )
        return None

    def _cleanup(self, log, api, name: str, has_service: bool) -> None:
        """Delete the Job (its pods go with it) and the Service; never masks the training outcome.

        Deletes are retried within the outage budget (the API wrapper). If the Job still cannot be
        deleted, it is suspended (the Job controller then terminates its pods, freeing the GPUs);
        if that fails too, the log says exactly what is left running and how to remove it.
        """
        ns = self.namespace
        body = kubernetes.client.V1DeleteOptions(
            propagation_policy=PropagationPolicy(self.delete_propagation_policy).value
        )
        try:
            api.batch_api.delete_namespaced_job(name, ns, body=body)
            log.info(f"Deleted Job {ns}/{name}")
        except Exception as e:
            if not (isinstance(e, kubernetes.client.ApiException) and e.status == 404):
                self._suspend_instead(log, api, name, e)
        if has_service:
            try:
                api.core_api.delete_namespaced_service(name, ns)
                log.info(f"Deleted Service {ns}/{name}")
            except kubernetes.client.ApiException as e:
                if e.status == 404:
                    log.info(f"Deleted Service {ns}/{name} (garbage-collected with its Job)")
                else:
                    log.warning(
                        f"Could not delete Service {ns}/{name} ({e.status} {e.reason}): it holds "
                        "no "
                        "resources; Kubernetes deletes it with its Job"
                    )
            except Exception as e:
                log.warning(
                    f"Could not delete Service {ns}/{name} ({e!r}); Kubernetes deletes it with "
                    "its Job"
                )

    def _suspend_instead(self, log, api, name: str, error: Exception) -> None:
        """Stop the pods of a Job that could not be deleted: a Kueue-managed Job by deactivating
        its Workload (Kueue would un-suspend it again), any other by ``spec.suspend``.
        """
        ns = self.namespace
        why = (
            f"{error.status} {error.reason}"
            if isinstance(error, kubernetes.client.ApiException)
            else str(error)
        )
        how = "suspended it"
        try:
            workload = None
            if self.queue_name:
                uid = api.batch_api.read_namespaced_job(name, ns).metadata.uid
                workload = kueue.workload_of(api, ns, uid)
            if workload is not None:
                kueue.deactivate(api, ns, workload)
                how = f"deactivated its Kueue Workload {workload['metadata']['name']}"
            else:
                api.batch_api.patch_namespaced_job(name, ns, {"spec": {"suspend": True}})
        except Exception as e:
            log.error(
                f"Could not delete Job {ns}/{name} ({why}) nor stop it ({e!r}): its pods "
                f"({JOB_LABEL}={name}) are LEFT RUNNING and hold their resources until "
                f"activeDeadlineSeconds={self.timeout_s} ends them; remove them with "
                f"`kubectl delete job -n {ns} {name}`"
            )
            return
        log.warning(
            f"Could not delete Job {ns}/{name} ({why}); {how} instead: the Job controller "
            f"terminates its pods; the Job object is left (no pods, no resources): remove it with "
            f"`kubectl delete job -n {ns} {name}`"
        )
