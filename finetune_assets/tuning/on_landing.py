"""Tuning the versions the new-data sensor registers, when a deployment turns it on.

Off by default (``LandingZoneResource.tune_new_versions``): ``landing_zone_sensor`` requests
``retrain_job`` for a new version, as always (its data preparation, then its training). On: the
version's training run is ``tune_job`` instead (``tuning_study`` in the training pool), same run key
and tags, so the sensor follows it as it follows a training run; when it succeeds,
``tuned_retrain_sensor`` requests ``finetune_only_job`` for the version with
``hyper_parameters_from: study``: the winner trained on the full budget, then the gate and promotion
as usual. Two runs, not one: in one run nothing orders ``tuning_study`` before ``finetuned_model``
(neither depends on the other).
"""

from __future__ import annotations

import dagster as dg

from finetune_assets.contracts import CHAMPION_MODEL, FINETUNED_MODEL, TUNING_STUDY
from finetune_assets.jobs import finetune_only_job, retrain_job, tune_job

AUTO_TUNE_TAG = "finetune_assets/auto_tune"  # on a tune_job run the sensor made: train the winner
TUNED_BY_TAG = (
    "finetune_assets/tuned_by_run"  # on the final run: the tune run it trains the winner of
)
TRAINS = {dg.AssetKey(FINETUNED_MODEL), dg.AssetKey(CHAMPION_MODEL)}
WINNER_CONFIG = {"ops": {FINETUNED_MODEL: {"config": {"hyper_parameters_from": "study"}}}}


def route(requests: list[dg.RunRequest], tune: bool) -> list[dg.RunRequest]:
    """The sensor's requests as they go out: all to ``retrain_job``; when tuning, a version's
    training run goes to ``tune_job`` as its study (data preparation runs as always).
    """
    return [
        _tune_first(r)
        if tune and TRAINS & set(r.asset_selection or ())
        else r.with_replaced_attrs(job_name=retrain_job.name)
        for r in requests
    ]


def _tune_first(request: dg.RunRequest) -> dg.RunRequest:
    """The same version's run with the study in place of the model (run key kept: one per
    version).
    """
    selection = [k for k in request.asset_selection or () if k not in TRAINS]
    return request.with_replaced_attrs(
        job_name=tune_job.name,
        asset_selection=[*selection, dg.AssetKey(TUNING_STUDY)],
        tags={**request.tags, AUTO_TUNE_TAG: "true"},
    )


def winner_request(run: dg.DagsterRun) -> dg.RunRequest | dg.SkipReason:
    """``finetune_only_job`` with the study's winner for the version a sensor-made tune run
    tuned.
    """
    version = run.tags.get("dagster/partition")
    if run.tags.get(AUTO_TUNE_TAG) != "true" or not version:
        return dg.SkipReason(f"run {run.run_id[:8]} was not requested by the new-data sensor")
    return dg.RunRequest(
        run_key=f"{run.run_id}:winner",  # one final run per tune run, whatever the ticks
        partition_key=version,
        run_config=WINNER_CONFIG,
        tags={TUNED_BY_TAG: run.run_id, AUTO_TUNE_TAG: "winner"},
    )


@dg.run_status_sensor(
    name="tuned_retrain_sensor",
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[tune_job],
    request_job=finetune_only_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="A tune_job run the new-data sensor made succeeded -> finetune_only_job trains "
    "the study's winner for that version (LandingZoneResource.tune_new_versions).",
)
def tuned_retrain_sensor(context: dg.RunStatusSensorContext) -> dg.RunRequest | dg.SkipReason:
    return winner_request(context.dagster_run)
