"""Whose is a live Job? The run named by its ``dagster/run-id`` label: a live Job of the same
asset + partition left by a run that is over is an orphan, removed before a new gang starts; one of
a run that is still going is that run's, and the launch fails.
"""

from __future__ import annotations

from collections.abc import Callable

from finetune_assets.core.launchers.k8s.constants import GANG_LABEL, Backend
from finetune_assets.core.launchers.k8s.jobset import GROUP, JOBSET_NAME_LABEL, PLURAL, VERSION
from finetune_assets.core.launchers.k8s.jobset import conditions as jobset_conditions

# A run id -> its status while it is live, None when it is finished or gone (its Jobs are orphans).
RunState = Callable[[str], "str | None"]


class LiveRunConflict(RuntimeError):
    """A live Job of the same asset + partition belongs to another, unfinished run."""


class TakeoverMixin:
    """The launcher's half that removes what a dead launcher left."""

    def _remove_live_gangs(
        self,
        log,
        api,
        key: str | None,
        what: str = "training Job",
        run_state: RunState | None = None,
        own_run: str | None = None,
    ) -> None:
        """Delete unfinished gangs of the same asset + partition whose Dagster run is over: two
        gangs would write one checkpoint folder and MLflow run.

        The run's status is asked first (``run_state``: the Dagster instance's, through the
        ``launcher`` resource): a Job whose run is still live (another run training the same
        partition) is left alone and this launch fails naming that run. A Job of this very run (a
        retried step) or of a finished or deleted run is an orphan: deleted rather than adopted (it
        may run another config; the new gang resumes from the same checkpoint). Without
        ``run_state`` every unfinished Job of the key is treated as an orphan.
        """
        if key is None:
            return
        ns = self.namespace
        if Backend(self.backend) is Backend.JOBSET:
            self._remove_live_jobsets(log, api, key, what, run_state, own_run)
        for other in api.batch_api.list_namespaced_job(
            ns, label_selector=f"{GANG_LABEL}={key}"
        ).items:
            if JOBSET_NAME_LABEL in (other.metadata.labels or {}):
                continue  # a JobSet's child: removed with its JobSet above
            conditions = (
                {c.type for c in (other.status.conditions or []) if c.status == "True"}
                if other.status
                else set()
            )
            if conditions & {"Complete", "Failed"} or other.metadata.deletion_timestamp:
                continue  # its pods, if any still run, are waited for below
            _take_over(
                log, f"{what} {ns}/{other.metadata.name}", other.metadata.labels, run_state, own_run
            )
            self._cleanup(log, api, other.metadata.name, has_service=True)
        # every pod of the key: also those of Jobs being deleted or already gone
        self._wait_pods_gone(log, api, f"{GANG_LABEL}={key}")

    def _remove_live_jobsets(
        self, log, api, key: str, what: str, run_state: RunState | None, own_run: str | None
    ) -> None:
        """:meth:`_remove_live_gangs` for JobSets (same rules: a live run's gang is left alone)."""
        ns = self.namespace
        items = api.custom_api.list_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, label_selector=f"{GANG_LABEL}={key}"
        )["items"]
        for other in items:
            meta = other["metadata"]
            if set(jobset_conditions(other)) & {"Completed", "Failed"} or meta.get(
                "deletionTimestamp"
            ):
                continue
            _take_over(
                log, f"{what} JobSet {ns}/{meta['name']}", meta.get("labels"), run_state, own_run
            )
            self._cleanup_jobset(log, api, meta["name"])


def _take_over(
    log, gang: str, labels: dict | None, run_state: RunState | None, own_run: str | None
) -> None:
    """Refuse when the live ``gang`` belongs to a Dagster run that is still going (two gangs would
    write one checkpoint); else say it is about to be deleted.
    """
    left_by = (labels or {}).get("dagster/run-id", "?")
    state = run_state(left_by) if run_state is not None and left_by not in ("?", own_run) else None
    if state is not None:
        raise LiveRunConflict(
            f"{gang} of the same asset and partition belongs to Dagster run {left_by}, which is "
            f"still {state}: two gangs would write one checkpoint. Wait for that run (or "
            "terminate it), then launch again"
        )
    log.warning(
        f"Deleting live {gang} of the same asset and partition (left by run {left_by}, which is "
        "over) before starting a new gang"
    )
