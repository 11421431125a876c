"""A version's study: open it in durable storage, recover a killed run's trials, run, summarize.

The study is its config: its name carries the hash of the versioned ``TuningConfig`` (space,
``fixed``, trial budget, pruner, sampler; ``TuningConfig.study_hash``), stored with the config as
study attributes. A changed space starts a new study; the old one stays in the storage and is
listed (``earlier_studies``). Raising ``n_trials`` continues the same study.

Trials are ``finetuned_model`` trainings through the configured launcher, shortened to the study's
budget; each reports validation macro-F1 to the study from the trainer
(core/training/trial/pruning.py).

A killed run leaves its trials RUNNING (a hard kill, a Dagster termination) or FAIL (Ctrl-C). Each
trial records the Dagster run that owns it (``dagster_run_id``): on the next run a RUNNING trial
whose run is no longer alive, and a FAIL one, is marked FAIL and its parameters are enqueued once
(``retry_of``), so no trial is lost and a live run's trials are left alone. On a database storage
heartbeats do the same for a run that dies mid-study (core/training/trial/study_storage.py). A
trial that
failed in training (``failure: training``) is not retried and never counts: only COMPLETE and
PRUNED trials do, so the study ends with exactly ``n_trials`` of them, unless more than
``max_failed_trials`` fail in one run or the time budget ends it first (``Outcome.reason``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from finetune_assets.core.training.trial.study_storage import (
    PRUNED_AT_STEP,
    make_pruner,
    open_storage,
)

RETRY_OF = "retry_of"  # user attribute: this trial re-runs one a killed run left unfinished
FAILURE = "failure"  # user attribute: "training" when the trainer itself failed (not retried)
MLFLOW_RUN = "mlflow_run_id"  # study user attribute: the parent MLflow run all trials nest under
OWNER = "dagster_run_id"  # trial user attribute: the Dagster run that runs it
CONFIG_HASH = "config_hash"  # study user attribute: TuningConfig.study_hash() it was made for
CONFIG = "config"  # study user attribute: the versioned TuningConfig it was made for
WARM_START = "warm_start_from"  # trial user attribute: "<version>/trial <n>" it re-tries
HEARTBEAT_RETRY_OF = "failed_trial"  # system attribute Optuna's heartbeat retry sets
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)

optuna.logging.set_verbosity(optuna.logging.WARNING)  # the asset logs each trial itself


# The searched fields (from the sampler); the rest come from ``fixed`` or the defaults.
SEARCHED = ("lr", "epochs", "warmup_ratio", "batch_size", "weight_decay", "class_weights")


class TuningConfig(Protocol):
    """What the study reads of its config: ``defs/tuning/space.py``'s ``TuningConfig`` (the
    launchpad's typed config) has it; the core only names the shape, so it never imports Dagster.
    """

    budget: Any
    include_default_recipe: bool
    max_failed_trials: int
    n_trials: int
    parallel_trials: int
    timeout_minutes: float | None
    unversioned: Any
    warm_start_trials: int

    def default_recipe(self) -> dict[str, Any]: ...
    def in_space(self, params: dict[str, Any]) -> bool: ...
    def make_sampler(self) -> Any: ...
    def model_dump(self) -> dict[str, Any]: ...
    def pruner_config(self) -> Any: ...
    def study_hash(self) -> str: ...
    def suggest(self, trial: Any) -> dict[str, Any]: ...


class TrainingFailedTrial(Exception):
    """A trial's training failed (the launcher raised): the trial is FAIL, the study goes on."""


def study_name(version: str, config: TuningConfig) -> str:
    return f"tuning-{version}-{config.study_hash()}"


def open_study(config: TuningConfig, storage: str, version: str) -> optuna.Study:
    """The study of this version and config, created on first use (then trial 0 is the default
    recipe when asked); one stored under this name for another config is refused.
    """
    study = optuna.create_study(
        study_name=study_name(version, config),
        storage=open_storage(storage, heartbeat=True),
        direction="maximize",
        sampler=config.make_sampler(),
        pruner=make_pruner(config.pruner_config()),
        load_if_exists=True,
    )
    stored = study.user_attrs.get(CONFIG_HASH)
    if stored is None:
        skip = {*config.unversioned, *config.budget}
        study.set_user_attr(CONFIG_HASH, config.study_hash())
        study.set_user_attr(CONFIG, {k: v for k, v in config.model_dump().items() if k not in skip})
    elif stored != config.study_hash():
        raise ValueError(
            f"study {study.study_name} was made for config {stored}, not {config.study_hash()}"
        )
    if not study.trials and config.include_default_recipe:
        study.enqueue_trial(config.default_recipe(), user_attrs={"default_recipe": True})
    study.sampler = config.make_sampler(len(study.trials))  # a resumed run draws new points
    return study


def warm_start(
    study: optuna.Study, config: TuningConfig, source: str, rows: list[dict[str, Any]]
) -> list[int]:
    """Enqueue the best ``warm_start_trials`` completed trials of another version's study
    (``rows``: its published trials.json) that lie inside this space, when this study has not
    started yet; the numbers of the trials re-tried.
    """
    if config.warm_start_trials <= 0 or any(
        t.state != TrialState.WAITING for t in study.get_trials(deepcopy=False)
    ):
        return []
    done = [
        r
        for r in rows
        if r.get("state") == "COMPLETE"
        and r.get("value") is not None
        and config.in_space(r["params"])
    ]
    top = sorted(done, key=lambda r: r["value"], reverse=True)[: config.warm_start_trials]
    for r in top:
        study.enqueue_trial(
            {k: r["params"][k] for k in SEARCHED},
            user_attrs={WARM_START: f"{source}/trial {r['number']}"},
            skip_if_exists=True,
        )
    return [r["number"] for r in top]


def earlier_studies(storage: str, version: str, current: str) -> list[str]:
    """The version's other studies in the storage (other configs), kept as they were."""
    names = optuna.get_all_study_names(open_storage(storage))
    return sorted(n for n in names if n.startswith(f"tuning-{version}-") and n != current)


def recover(study: optuna.Study, alive: Callable[[str], bool] = lambda run: False) -> list[int]:
    """Mark a dead run's unfinished trials FAIL, enqueue their parameters once; their numbers.

    ``alive(run_id)``: whether the Dagster run owning a RUNNING trial still runs (a retry beside
    an orphaned gang): its trials are not touched.
    """
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get(RETRY_OF) for t in trials} | {
        t.system_attrs.get(HEARTBEAT_RETRY_OF) for t in trials
    }
    requeued = []
    for t in trials:
        owner = t.user_attrs.get(OWNER)
        if t.state == TrialState.RUNNING and owner and alive(owner):
            continue
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


def training_failures(study: optuna.Study, owner: str) -> int:
    """Trials of run ``owner`` whose training failed."""
    return sum(
        t.user_attrs.get(FAILURE) == "training" and t.user_attrs.get(OWNER) == owner
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    )


# run_trial(trial, params): trains one trial to its end or pruning; TrainingFailedTrial on failure.
RunTrial = Callable[[optuna.Trial, dict[str, Any]], None]


def objective(
    config: TuningConfig, study: optuna.Study, run_trial: RunTrial, owner: str = ""
) -> Callable[[optuna.Trial], float]:
    """Suggest, train through the launcher, then read what the trainer reported to the storage."""

    def run(trial: optuna.Trial) -> float:
        trial.set_user_attr(OWNER, owner)
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


@dataclass(frozen=True)
class Outcome:
    """What one run of the study did, and why it stopped."""

    ran: int  # trials started
    failed: int  # of them, failed in training (never counted toward n_trials)
    reason: str  # "n_trials" (met), "timeout", "failures" (max_failed_trials reached)

    @property
    def complete(self) -> bool:
        return self.reason == "n_trials"


def optimize(
    config: TuningConfig, study: optuna.Study, run_trial: RunTrial, owner: str = ""
) -> Outcome:
    """Run trials until ``n_trials`` are COMPLETE or PRUNED, ``max_failed_trials`` of this run
    failed, or the time budget is spent. Rounds of at most the trials still missing: a failed
    trial is replaced, and parallel trials never overshoot ``n_trials``.
    """
    before = _started(study)
    deadline = time.monotonic() + config.timeout_minutes * 60 if config.timeout_minutes else None
    reason = "n_trials"
    while (remaining := config.n_trials - finished(study)) > 0:
        if training_failures(study, owner) >= config.max_failed_trials:
            reason = "failures"
            break
        left = deadline - time.monotonic() if deadline is not None else None
        if left is not None and left <= 0:
            reason = "timeout"
            break
        study.optimize(
            objective(config, study, run_trial, owner),
            n_trials=remaining,
            timeout=left,
            n_jobs=config.parallel_trials,
            catch=(TrainingFailedTrial,),
            callbacks=[_stop_at(config.max_failed_trials, owner)],
            gc_after_trial=False,
        )
    return Outcome(
        ran=_started(study) - before, failed=training_failures(study, owner), reason=reason
    )


def _stop_at(failures: int, owner: str) -> Callable[[optuna.Study, FrozenTrial], None]:
    """Stops the round once ``failures`` of this run's trials failed in training."""

    def stop(study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state == TrialState.FAIL and training_failures(study, owner) >= failures:
            study.stop()

    return stop


def _started(study: optuna.Study) -> int:
    return sum(t.state != TrialState.WAITING for t in study.get_trials(deepcopy=False))


@dataclass(frozen=True)
class Summary:
    """What the asset publishes and shows: the trials, the best one, the counts."""

    rows: list[dict[str, Any]]
    best: dict[str, Any] | None
    counts: dict[str, int]
    failed_in_training: int = 0  # FAIL trials the trainer failed (apart from killed-run ones)


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
                "failure": t.user_attrs.get(FAILURE),
                "warm_start_from": t.user_attrs.get(WARM_START),
            }
        )
    counts = {s.name: sum(r["state"] == s.name for r in rows) for s in TrialState}
    best = None
    if counts["COMPLETE"]:
        b = study.best_trial
        best = {"trial": b.number, "value": b.value, "params": dict(b.params)}
    failed = sum(r["failure"] == "training" for r in rows)
    return Summary(rows=rows, best=best, counts=counts, failed_in_training=failed)


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
