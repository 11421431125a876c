"""Whose is a live Job? Dagster says: the run named by its ``dagster/run-id`` label."""

from __future__ import annotations

from collections.abc import Callable

import dagster as dg

# A run id -> its status while it is live, None when it is finished or gone (its Jobs are orphans).
RunState = Callable[[str], "str | None"]


class LiveRunConflict(RuntimeError):
    """A live Job of the same asset + partition belongs to another, unfinished Dagster run."""


def dagster_run_state(instance: dg.DagsterInstance) -> RunState:
    """:data:`RunState` from the Dagster instance the step runs in."""

    def state(run_id: str) -> str | None:
        run = instance.get_run_by_id(run_id)
        return None if run is None or run.is_finished else run.status.value

    return state
