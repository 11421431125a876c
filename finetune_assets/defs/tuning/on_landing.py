"""Tuning the versions a deployment registers, where it loads the tuning definitions.

Off by default: ``definitions.defs`` trains every new version with the default recipe
(``automation.AFTER_DATA_RUN`` on ``finetuned_model``). A deployment that tunes each new version
loads ``finetune_assets.defs.tuning.definitions`` instead (``build_defs(tune_new_versions=True)``):
the
study takes the model's place (``tuning_study`` in the training pool, requested by
``tuning_automation`` after the version's data run, tagged ``AUTO_TUNE_TAG``); when it succeeds,
``tuned_retrain_sensor`` requests ``finetune_only_job`` for the version with
``hyper_parameters_from: study``: the winner trained on the full budget, then the gate and promotion
as usual. A study that fails is not a version that fails: when it found no completed trial (the run
then ends without a study) or was cut short (``study_complete: false``: time budget, too many failed
trials), the final run trains the default recipe instead, tagged ``finetune_assets/tuning_fallback``
with the reason (shown by ``finetune-assets summary``). Two runs, not one: in one run nothing orders
``tuning_study`` before ``finetuned_model`` (neither depends on the other).
"""

from __future__ import annotations

import dagster as dg

from finetune_assets.core.io.contracts import FINETUNED_MODEL, TUNING_STUDY
from finetune_assets.core.tuning.tags import AUTO_TUNE_TAG, FALLBACK_TAG, TUNED_BY_TAG
from finetune_assets.defs.automation import automation_sensor
from finetune_assets.defs.jobs import RETRY_TAGS, finetune_only_job

WINNER_CONFIG = {"ops": {FINETUNED_MODEL: {"config": {"hyper_parameters_from": "study"}}}}


def winner_request(
    run: dg.DagsterRun, instance: dg.DagsterInstance | None = None
) -> dg.RunRequest | dg.SkipReason:
    """``finetune_only_job`` with the study's winner for the version a sensor-made tune run
    tuned; the default recipe when its study failed or was cut short (``instance``: where the
    run's materialization says which).
    """
    version = run.tags.get("dagster/partition")
    if run.tags.get(AUTO_TUNE_TAG) != "true" or not version:
        return dg.SkipReason(f"run {run.run_id[:8]} was not requested by tuning_automation")
    why = _study_failed(run, instance) if instance is not None else None
    if why:
        return dg.RunRequest(
            run_key=f"{run.run_id}:fallback",
            partition_key=version,
            tags={TUNED_BY_TAG: run.run_id, AUTO_TUNE_TAG: "fallback", FALLBACK_TAG: why},
        )
    return dg.RunRequest(
        run_key=f"{run.run_id}:winner",  # one final run per tune run, whatever the ticks
        partition_key=version,
        run_config=WINNER_CONFIG,
        tags={TUNED_BY_TAG: run.run_id, AUTO_TUNE_TAG: "winner"},
    )


def _study_failed(run: dg.DagsterRun, instance: dg.DagsterInstance) -> str | None:
    """Why the run's study is not to be trusted (none published, or cut short); None if it is."""
    logs = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    studies = [
        e.asset_materialization
        for e in logs
        if e.asset_materialization
        and e.asset_materialization.asset_key == dg.AssetKey(TUNING_STUDY)
    ]
    if not studies:
        return f"run {run.run_id[:8]}'s study found no completed trial (its log says why)"
    meta = studies[-1].metadata
    complete = meta.get("study_complete")
    if complete is not None and complete.value is False:
        stopped = meta.get("study_stopped")
        return f"run {run.run_id[:8]}'s study was cut short ({stopped.value if stopped else '?'})"
    return None


@dg.run_status_sensor(
    name="tuned_retrain_sensor",
    run_status=dg.DagsterRunStatus.SUCCESS,
    request_job=finetune_only_job,  # monitors every job of the code location: automation's too
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="A run tuning_automation made succeeded -> finetune_only_job trains "
    "the study's winner for that version, or the default recipe when the study failed or was cut "
    "short (finetune_assets.defs.tuning.definitions).",
)
def tuned_retrain_sensor(context: dg.RunStatusSensorContext) -> dg.RunRequest | dg.SkipReason:
    request = winner_request(context.dagster_run, context.instance)
    if isinstance(request, dg.RunRequest) and FALLBACK_TAG in request.tags:
        context.log.warning(f"default recipe for the version: {request.tags[FALLBACK_TAG]}")
    return request


# The study of each new version, after its data run (``automation.AFTER_DATA_RUN``), its runs tagged
# as this sensor's: ``tuned_retrain_sensor`` follows those only.
tuning_automation = automation_sensor(
    "tuning_automation",
    dg.AssetSelection.assets(TUNING_STUDY),
    {**RETRY_TAGS, AUTO_TUNE_TAG: "true"},
    "tuning_study[v] for each new version, after its data run.",
)
