"""Declarative automation: what prepares, trains, gates, promotes and scores a new dataset version.

The landing sensor only registers a version (its record and its partition,
``defs/versions/landing_sensor.py``); from there Dagster's automation conditions alone build it,
evaluated per partition by one ``AutomationConditionSensorDefinition`` (``version_automation``) in
the daemon, which persists each tick's requests. Applied once, at the root
(``definitions.build_defs``), not per asset.

Two conditions per version (and ``ONCE_IF_MISSING`` for the shared base model), both Dagster's
``eager()`` in shape (missing and never requested, or an update of a dependency since the asset
was last requested; nothing missing or in progress upstream; the asset itself not in progress)
and both requiring every upstream *blocking* check to have passed (``eager()`` alone does not look
at checks, so an asset downstream of a failed ``raw_reviews`` contract or
``mds_shards`` integrity check would be requested):

- ``AFTER_UPSTREAM`` (``raw_reviews``, ``tokenized_reviews``, ``mds_shards``, ``baseline_model``,
  ``champion_model``, ``benchmark_scores``): counts a dependency requested on the same tick as
  updated, so a version's data preparation is one run (Dagster groups one tick's
  requests by partition), and promotion and scoring join their model's run, behind the gate
  (``finetuned_model_quality_gate`` is blocking: a refused gate fails the run before
  ``champion_model``; the check shows failed, the champion does not move);
- ``AFTER_DATA_RUN`` (``finetuned_model``, or ``tuning_study`` where new versions are tuned): a
  dependency requested on this tick counts as *not ready*, so training is never in its data's run.
  It is requested on the tick after the data run succeeded, as a run of its own whose first step
  is in the ``training`` pool: the run queue keeps it queued, holding no run pod, until a slot is
  free (``deploy/instance/dagster.yaml``).

Updates of ``pretrained_model`` trigger nothing (``.ignore``): it is shared by every version, and a
rebuilt base model should not retrain every version at once; they show stale instead and a person
chooses ("Materialize stale", ``jobs.base_model_job``). It still must exist: a version waits for it.

What the hand-written run state machine guaranteed, by Dagster's rules: a condition is true once per
trigger (``since_last_handled``: the tick that requests it handles it), so a cancelled or failed run
is never requested again by automation (a person re-executes it, or new data triggers again); the
daemon's run retries (``jobs.RETRY_TAGS`` on every automation run) are the one retry layer for lost
run workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import dagster as dg

from finetune_assets.core.io.contracts import (
    FINETUNED_MODEL,
    PRETRAINED_MODEL,
    TUNING_STUDY,
)
from finetune_assets.defs.jobs import RETRY_TAGS

AC = dg.AutomationCondition
_SHARED = dg.AssetSelection.assets(PRETRAINED_MODEL)  # its updates trigger no version


# Missing and not requested since it was last materialized: a new partition (or the base model of a
# fresh deployment) once. Not ``eager()``'s ``newly_missing``: that never fires for a partition
# already there at the condition's first evaluation (a version registered before the automation
# sensor's first tick would never be built). Once requested, a failed or cancelled run leaves it
# missing and not requested again.
MISSING_UNREQUESTED = (AC.missing() & ~AC.newly_requested().since(AC.newly_updated())).with_label(
    "missing_unrequested"
)


def _triggered(updated: dg.AutomationCondition) -> dg.AutomationCondition:
    return (MISSING_UNREQUESTED | updated.since_last_handled()).with_label("triggered")


# Every dependency's blocking checks passed, or the dependency runs with this asset (its checks then
# ride along and a failure stops this asset's step in that run). Dagster's
# ``all_deps_blocking_checks_passed`` wants the *checks* requested on the tick, and checks without a
# condition of their own never are, so it would hold every downstream asset out of its
# dependency's run.
_CHECKS_PASSED = AC.all_deps_match(
    AC.will_be_requested() | AC.all_checks_match(AC.check_passed(), blocking_only=True)
).with_label("deps_blocking_checks_passed")

AFTER_UPSTREAM = (
    _triggered(AC.any_deps_updated().ignore(_SHARED))
    & ~AC.any_deps_missing()
    & ~AC.any_deps_in_progress()
    & ~AC.in_progress()
    & _CHECKS_PASSED
).with_label("after_upstream")

# Dependencies updated by an earlier run only: ``newly_updated`` without ``will_be_requested``.
_UPDATED_BEFORE = AC.any_deps_match(AC.newly_updated() & ~AC.executed_with_root_target()).ignore(
    _SHARED
)
_NOT_READY = AC.any_deps_match(AC.missing() | AC.will_be_requested() | AC.in_progress())

AFTER_DATA_RUN = (
    _triggered(_UPDATED_BEFORE) & ~_NOT_READY & ~AC.in_progress() & _CHECKS_PASSED
).with_label("after_data_run")

# The shared base model, built once where it is missing (a fresh deployment; the default source
# unless a person built it first, ``base_model_job``).
ONCE_IF_MISSING = (MISSING_UNREQUESTED & ~AC.in_progress()).with_label("once_if_missing")

MANUAL = (TUNING_STUDY,)  # tune_job, by a person (or AFTER_DATA_RUN where new versions are tuned)


def conditions(tune_new_versions: bool = False) -> dict[str, dg.AutomationCondition | None]:
    """Each asset's condition; where new versions are tuned, the study takes the model's place
    (``tuned_retrain_sensor`` then trains the winner, with the gate and promotion in its run).
    """
    train = TUNING_STUDY if tune_new_versions else FINETUNED_MODEL
    return {
        PRETRAINED_MODEL: ONCE_IF_MISSING,
        TUNING_STUDY: None,
        FINETUNED_MODEL: None,
        train: AFTER_DATA_RUN,
    }


def with_automation(
    assets: Iterable[dg.AssetsDefinition], tune_new_versions: bool = False
) -> Sequence[dg.AssetsDefinition]:
    """Every executable asset with its condition (``AFTER_UPSTREAM`` unless ``conditions`` says
    otherwise); an asset without a function (``champion``, reported by ``champion_model``) as it is.
    """
    special = conditions(tune_new_versions)
    out = []
    for asset in assets:
        if isinstance(asset, dg.AssetsDefinition) and asset.is_executable:
            asset = asset.map_asset_specs(
                lambda spec: spec.replace_attributes(
                    automation_condition=special.get(spec.key.to_user_string(), AFTER_UPSTREAM)
                )
            )
        out.append(asset)
    return out


def automation_sensor(
    name: str, target: dg.AssetSelection, run_tags: dict[str, str], description: str
) -> dg.AutomationConditionSensorDefinition:
    """A sensor evaluating the conditions of ``target`` per partition in the daemon, running by
    default, one run per version and step of the chain (a backfill would pool versions).
    """
    return dg.AutomationConditionSensorDefinition(
        name,
        target=target,
        run_tags=run_tags,
        emit_backfills=False,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description,
    )


def version_automation(tune_new_versions: bool = False) -> dg.AutomationConditionSensorDefinition:
    """The automation that builds every version; where new versions are tuned, every asset but the
    study, which has a sensor of its own (``tuning_automation``, ``defs/tuning/on_landing.py``).
    """
    target = dg.AssetSelection.all()
    if tune_new_versions:
        target = target - dg.AssetSelection.assets(TUNING_STUDY)
    return automation_sensor(
        "version_automation",
        target,
        RETRY_TAGS,
        "Each version's data preparation, then its training, gate, promotion and benchmark "
        "scores, by the assets' automation conditions (defs/automation.py).",
    )
