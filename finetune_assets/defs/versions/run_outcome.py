"""What ended a version's failed run, in words a person acts on: the quality gate refused the model,
a blocking data check refused the data, or a step failed (``version_outcome_sensor`` tags the run
with it, ``finetune-assets versions`` shows it).
"""

from __future__ import annotations

import dagster as dg

from finetune_assets.defs.dagster_internals import WILL_RETRY_TAG

STATUS_TAG = "finetune_assets/version_status"  # on a failed run: why, in the run list


# What a failure diagnosis reads of a run group's event log: check verdicts and step failures only
# (filtered in the storage's query). Every trainer output line is an event of its own: reading all
# of them made a tick's cost grow with hours of training.
DIAGNOSIS_EVENTS = {dg.DagsterEventType.ASSET_CHECK_EVALUATION, dg.DagsterEventType.STEP_FAILURE}


def run_outcome(instance, run: dg.DagsterRun) -> str:
    """How a finished, unsuccessful run ended, in words a person acts on (its run group's
    events).
    """
    rid = run.run_id[:8]
    if run.status == dg.DagsterRunStatus.CANCELED:
        return f"run {rid} was cancelled; not re-requested (re-execute it to resume)"
    group = instance.get_run_group(run.run_id)
    gate, refused, failed = None, [], []
    for member in group[1] if group else [run]:
        this_run = member.run_id == run.run_id
        for entry in instance.all_logs(member.run_id, of_type=DIAGNOSIS_EVENTS):
            event = entry.dagster_event
            if event is None:
                continue
            if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                evaluation = event.event_specific_data
                if evaluation.passed or evaluation.severity != dg.AssetCheckSeverity.ERROR:
                    continue
                if evaluation.check_name == "quality_gate":
                    gate = evaluation.description or "refused"
                elif this_run:
                    fix = getattr(evaluation.metadata.get("fix"), "value", "")
                    refused.append(
                        f"{evaluation.check_name} ({evaluation.description or 'failed'}"
                        + (f"; fix: {fix})" if fix else ")")
                    )
            elif event.event_type == dg.DagsterEventType.STEP_FAILURE and this_run:
                failed.append(f"{event.step_key} ({_first_line(event.step_failure_data.error)})")
    if gate is not None:
        return f"trained, but the quality gate refused the model: {gate}"
    if refused:  # a blocking data check stopped the chain: the data needs fixing, not the run
        return f"run {rid}: blocking check {'; '.join(refused)[:800]} refused the data"
    steps = "; ".join(failed) or "the run worker (no step failed: see the run's events)"
    return f"run {rid} failed at {steps}; fix it, then re-execute run {rid} from failure"


def _first_line(error) -> str:
    """The user's exception (innermost cause, not Dagster's wrapper), first line."""
    while error is not None and error.cause is not None:
        error = error.cause
    text = error.message.strip() if error is not None else ""
    return text.splitlines()[0][:160] if text else "?"


@dg.run_failure_sensor(
    name="version_outcome_sensor",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="A failed run of a version -> tagged with what ended it (refused by the quality "
    "gate, refused by a blocking data check, or the failed step), in the run list.",
)
def version_outcome_sensor(context: dg.RunFailureSensorContext) -> None:
    run = context.dagster_run
    if run.tags.get(WILL_RETRY_TAG) == "true":
        return  # the daemon re-launches it; its retry reports
    why = run_outcome(context.instance, run)
    context.instance.add_run_tags(run.run_id, {STATUS_TAG: why[:255]})
    version = run.tags.get("dagster/partition", "?")
    context.log.warning(f"dataset version {version}: {why}")
