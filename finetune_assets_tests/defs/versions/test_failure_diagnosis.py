"""The sensor's failure diagnosis (``run_outcome.run_outcome``) reads only the event types it needs
from a run's event log, whatever else the run logged (every trainer output line is an event).
"""

import dagster as dg

from finetune_assets.defs.versions.run_outcome import DIAGNOSIS_EVENTS, run_outcome

LOG_LINES = 300


@dg.asset
def chatty(context: dg.AssetExecutionContext) -> None:
    for i in range(LOG_LINES):  # what a long training forwards: one event per line
        context.log.info(f"step {i}")
    raise RuntimeError("CUDA out of memory")


def test_a_failed_runs_diagnosis_names_the_step_and_reads_no_log_lines(instance):
    result = dg.materialize([chatty], instance=instance, raise_on_error=False)
    run = instance.get_run_by_id(result.run_id)
    storage = instance.event_log_storage
    read: list = []
    original = storage.get_logs_for_run

    def counting(run_id, *args, **kwargs):  # the real storage; only what it returns is counted
        entries = original(run_id, *args, **kwargs)
        read.extend(entries)
        return entries

    storage.get_logs_for_run = counting
    try:
        why = run_outcome(instance, run)
    finally:
        storage.get_logs_for_run = original
    assert "failed at chatty (RuntimeError: CUDA out of memory)" in why, why
    assert len(instance.all_logs(run.run_id)) > LOG_LINES  # the log lines are there ...
    types = {e.dagster_event.event_type if e.dagster_event else "log line" for e in read}
    assert read and types <= DIAGNOSIS_EVENTS  # ... and unread
