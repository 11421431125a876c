"""A version's study: open it in durable storage, recover a killed run's trials, run, summarize.

Trials are ``finetuned_model`` trainings through the configured launcher, shortened to the study's
budget; each reports validation macro-F1 to the study from the trainer (training/pruning.py).

A killed run leaves its trials RUNNING (a hard kill, a Dagster termination) or FAIL (Ctrl-C): on the
next run each such trial is marked FAIL and its parameters are enqueued once (``retry_of``), so no
trial is lost; a trial that failed in training (``failure: training``) is not retried. Only COMPLETE
and PRUNED trials count toward ``n_trials``, so none is run twice and the study ends with exactly
``n_trials`` of them. One run tunes a version at a time (the asset's ``training`` pool and the run
queue): a second concurrent run would take the first one's RUNNING trials for dead ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from finetune_assets.training.study_storage import PRUNED_AT_STEP, make_pruner, open_storage
from finetune_assets.tuning.space import SEARCHED, TuningConfig

RETRY_OF = "retry_of"  # user attribute: this trial re-runs one a killed run left unfinished
FAILURE = "failure"  # user attribute: "training" when the trainer itself failed (not retried)
MLFLOW_RUN = "mlflow_run_id"  # study user attribute: the parent MLflow run all trials nest under
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)

optuna.logging.set_verbosity(optuna.logging.WARNING)  # the asset logs each trial itself


class TrainingFailedTrial(Exception):
    """A trial's training failed (the launcher raised): the trial is FAIL, the study goes on."""


def study_name(version: str) -> str:
    return f"tuning-{version}"


def open_study(config: TuningConfig, storage: str, version: str) -> optuna.Study:
    """The version's study, created on first use (then trial 0 is the default recipe when asked)."""
    study = optuna.create_study(
        study_name=study_name(version),
        storage=open_storage(storage),
        direction="maximize",
        sampler=config.sampler(),
        pruner=make_pruner(config.pruner_config()),
        load_if_exists=True,
    )
    if not study.trials and config.include_default_recipe:
        study.enqueue_trial(config.default_recipe(), user_attrs={"default_recipe": True})
    study.sampler = config.sampler(len(study.trials))  # a resumed run draws new points
    return study


def recover(study: optuna.Study) -> list[int]:
    """Mark a killed run's unfinished trials FAIL, enqueue their parameters once; their numbers."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF) for t in trials}
    requeued = []
    for t in trials:
        unfinished = t.state == TrialState.RUNNING or (
            t.state == TrialState.FAIL and t.user_attrs.get(FAILURE) != "training"
        )
        if not unfinished:
            continue
        if t.state == TrialState.RUNNING:  # no public API sets another run's trial state
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        if t.number not in retried and set(SEARCHED) <= set(t.params):
            study.enqueue_trial(t.params, user_attrs={RETRY_OF: t.number})
            requeued.append(t.number)
    return requeued


def finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


# run_trial(trial, params): trains one trial to its end or pruning; TrainingFailedTrial on failure.
RunTrial = Callable[[optuna.Trial, dict[str, Any]], None]


def objective(
    config: TuningConfig, study: optuna.Study, run_trial: RunTrial
) -> Callable[[optuna.Trial], float]:
    """Suggest, train through the launcher, then read what the trainer reported to the storage."""

    def run(trial: optuna.Trial) -> float:
        params = config.suggest(trial)
        try:
            run_trial(trial, params)
        except TrainingFailedTrial:
            trial.set_user_attr(FAILURE, "training")
            raise
        reported = reported_trial(study, trial.number)
        if PRUNED_AT_STEP in reported.user_attrs:
            raise optuna.TrialPruned(f"at step {reported.user_attrs[PRUNED_AT_STEP]}")
        if not reported.intermediate_values:
            trial.set_user_attr(FAILURE, "training")
            raise TrainingFailedTrial(
                f"trial {trial.number} finished without reporting a validation metric"
            )
        # the model it ended with
        return reported.intermediate_values[max(reported.intermediate_values)]

    return run


def reported_trial(study: optuna.Study, number: int) -> FrozenTrial:
    """The trial as the trainer left it in the storage (read back, not a cached copy)."""
    for t in study.get_trials(deepcopy=False):
        if t.number == number:
            return t
    raise KeyError(f"trial {number} is not in study {study.study_name}")


def optimize(config: TuningConfig, study: optuna.Study, run_trial: RunTrial) -> int:
    """Run trials until ``n_trials`` are COMPLETE or PRUNED, or the time budget is spent."""
    remaining = config.n_trials - finished(study)
    if remaining <= 0:
        return 0
    timeout = config.timeout_minutes * 60 if config.timeout_minutes else None
    before = _started(study)
    study.optimize(
        objective(config, study, run_trial),
        n_trials=remaining,
        timeout=timeout,
        n_jobs=config.parallel_trials,
        catch=(TrainingFailedTrial,),
        gc_after_trial=False,
    )
    return _started(study) - before


def _started(study: optuna.Study) -> int:
    return sum(t.state != TrialState.WAITING for t in study.get_trials(deepcopy=False))


@dataclass(frozen=True)
class Summary:
    """What the asset publishes and shows: the trials, the best one, the counts."""

    rows: list[dict[str, Any]]
    best: dict[str, Any] | None
    counts: dict[str, int]


def summarize(study: optuna.Study) -> Summary:
    rows = []
    for t in study.get_trials(deepcopy=False):
        seconds = (
            (t.datetime_complete - t.datetime_start).total_seconds()
            if t.datetime_complete and t.datetime_start
            else None
        )
        steps = t.intermediate_values
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value,
                "reports": max(steps) if steps else None,  # reports are numbered 1, 2, ...
                "seconds": seconds,
                "params": dict(t.params),
                "retry_of": t.user_attrs.get(RETRY_OF),
                "pruned_at_step": t.user_attrs.get(PRUNED_AT_STEP),
            }
        )
    counts = {s.name: sum(r["state"] == s.name for r in rows) for s in TrialState}
    best = None
    if counts["COMPLETE"]:
        b = study.best_trial
        best = {"trial": b.number, "value": b.value, "params": dict(b.params)}
    return Summary(rows=rows, best=best, counts=counts)


def importances(study: optuna.Study) -> dict[str, float]:
    """fANOVA importance of each searched parameter (empty while fewer than two trials completed).

    When every completed trial scored the same, no parameter explains anything: all are 0.
    """
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return {}
    if len({t.value for t in complete}) == 1:
        return {name: 0.0 for name in complete[0].params}
    return optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)
    )
