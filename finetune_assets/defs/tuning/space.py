"""The study's typed config: search space, budget, pruner, storage (the ``tuning_study`` launchpad).

Defaults are sized for the default version (3,000 English snippets, all-MiniLM-L6-v2) on two CPU
cores: six trials of each one's full budget (its epochs: what ``finetuned_model`` then trains, so
the study ranks exactly the runs it chooses between; a shortened proxy did not rank them), the
first one the default recipe, a GP sampler (few trials), a median pruner deciding from the second
of six reports per trial, taken at equal fractions of each trial's own training, once three trials
finished (a median of one trial is that trial's luck), a 20-minute budget. Epochs are searched
(1-3): one epoch is little on a version this small, and one epoch of it is ~2 minutes here.
``finetuned_model`` with ``hyper_parameters_from: study`` then trains the winner with the study's
``fixed`` settings. On a larger version or a GPU raise ``n_trials``; on a much larger one, set
``trial_max_steps`` to tune on shortened runs.

What the study is (``study_hash``): the space, ``fixed``, each trial's budget and reports. A change
there is a new study; how many trials, how they are sampled and pruned, and where and how fast they
run continue the same one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar, Literal, get_args

import dagster as dg
import optuna
from pydantic import Field, model_validator

from finetune_assets.core.training.config import PrunerConfig
from finetune_assets.core.training.hyperparameters import ClassWeights, HyperParameters
from finetune_assets.core.tuning.study import SEARCHED  # re-exported: the launchpad's space


class FixedSettings(dg.PermissiveConfig):
    """Other ``finetuned_model`` settings for every trial (accelerator, precision, max_length ...).

    Checked against ``HyperParameters`` when the study starts: an unknown key fails there.
    """

    def settings(self) -> dict[str, Any]:
        return self.model_dump()


class TuningConfig(dg.Config):
    """Search space, budget and pruner of one version's study."""

    # Where and how fast, not what: left out of the code version (defs/staleness.py).
    unversioned: ClassVar[tuple[str, ...]] = (
        "timeout_minutes",
        "parallel_trials",
        "storage_url",
        "in_training_runs",
    )
    # Not part of what the study is (``study_hash``): how many trials and how the next one is
    # chosen or stopped; raising the budget or changing the sampler continues the same study.
    budget: ClassVar[tuple[str, ...]] = (
        "n_trials",
        "max_failed_trials",
        "pruner",
        "pruner_startup_trials",
        "pruner_warmup_reports",
        "sampler",
        "sampler_startup_trials",
        "seed",
        "include_default_recipe",
        "warm_start_trials",
    )

    n_trials: int = Field(
        6, ge=1, description="completed + pruned trials the study ends with (resumes count)"
    )
    timeout_minutes: float | None = Field(
        20.0, gt=0, description="no new trial starts after this (this run)"
    )
    parallel_trials: int = Field(
        1, ge=1, description="trials at once (each a training launch; k8s: one gang each)"
    )
    trial_max_steps: int = Field(
        -1, ge=-1, description="optimizer steps per trial (-1: the trial's epochs, as trained)"
    )
    reports_per_trial: int = Field(
        6,
        ge=1,
        description="pruner reports per trial, at equal fractions of each trial's own training "
        "(6: every trial of 1, 2 or 3 epochs validates exactly 6 times)",
    )
    pruner: Literal["median", "none"] = Field(
        "median",
        description="median: stop a trial below the median of earlier trials at the same step",
    )
    pruner_startup_trials: int = Field(
        3,
        ge=0,
        description="trials finished before any pruning (a median of fewer is one trial's luck)",
    )
    max_failed_trials: int = Field(
        3,
        ge=1,
        description="trials failing in training before the study stops (they never count "
        "toward n_trials; reported apart)",
    )
    pruner_warmup_reports: int = Field(
        1, ge=0, description="first reports of a trial that never prune it"
    )
    sampler: Literal["auto", "tpe", "gp", "qmc"] = Field(
        "auto",
        description="auto: GP (a Gaussian process, made for few trials) when n_trials <= 10, "
        "TPE beyond; qmc: a quasi-random Sobol sequence (no model)",
    )
    sampler_startup_trials: int = Field(
        3, ge=1, description="random trials before the GP or TPE models the space"
    )
    seed: int = 0
    warm_start_trials: int = Field(
        2,
        ge=0,
        description="a new study first tries this many of the previous version's best completed "
        "trials (same label set, inside this space); 0: start cold",
    )
    include_default_recipe: bool = Field(
        True, description="trial 0 is finetuned_model's default recipe"
    )
    in_training_runs: bool = Field(
        False,
        description="also run in a run that trains finetuned_model (a "
        "whole-graph run); off: such runs skip the study",
    )
    storage_url: str | None = Field(
        None,
        description="database URL (a cluster), or env:NAME for the environment variable that "
        "holds it (a password never reaches a file: trials get it by environment); empty: a "
        "journal file under the storage root (local roots only)",
    )

    lr_low: float = Field(1e-5, gt=0)
    lr_high: float = Field(3e-4, gt=0, description="lr is sampled log-uniform in [lr_low, lr_high]")
    epochs: list[int] = Field(
        [1, 2, 3],
        min_length=1,
        description="choices (matter for trials when trial_max_steps "
        "is -1; the final model trains the winner's epochs)",
    )
    warmup_ratio_low: float = Field(0.0, ge=0, lt=1)
    warmup_ratio_high: float = Field(0.2, ge=0, lt=1)
    batch_size: list[int] = Field([8, 16], min_length=1, description="choices, per device")
    weight_decay_low: float = Field(0.0, ge=0)
    weight_decay_high: float = Field(0.1, ge=0)
    class_weights: list[str] = Field(
        ["balanced", "none"], min_length=1, description="choices: balanced, none"
    )
    fixed: FixedSettings = Field(
        FixedSettings(),
        description="other finetuned_model settings "
        "for every trial (e.g. accelerator, precision, max_length)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> TuningConfig:
        for low, high in (
            ("lr_low", "lr_high"),
            ("warmup_ratio_low", "warmup_ratio_high"),
            ("weight_decay_low", "weight_decay_high"),
        ):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} {getattr(self, low)} > {high} {getattr(self, high)}")
        bad = sorted(set(self.class_weights) - set(get_args(ClassWeights)))
        if bad:
            raise ValueError(
                f"class_weights choices {bad}: expected {list(get_args(ClassWeights))}"
            )
        fixed = self.fixed.settings()
        clash = sorted(set(fixed) & {*SEARCHED, "max_steps"})
        if clash:
            raise ValueError(
                f"fixed sets searched or budget fields {clash}: change the search space instead"
            )
        HyperParameters.model_validate(fixed)  # unknown keys fail here
        return self

    def study_hash(self) -> str:
        """What this study is (the space, ``fixed``, each trial's budget and reports), hashed: a
        study of another config is another study. Where, how fast, how many trials and how they
        are chosen or pruned are not in it (``unversioned``, ``budget``).
        """
        skip = {*self.unversioned, *self.budget}
        body = {k: v for k, v in self.model_dump().items() if k not in skip}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:10]

    def in_space(self, params: dict[str, Any]) -> bool:
        """Whether ``params`` (a trial of another study) is a point of this space."""
        try:
            return (
                self.lr_low <= params["lr"] <= self.lr_high
                and params["epochs"] in self.epochs
                and self.warmup_ratio_low <= params["warmup_ratio"] <= self.warmup_ratio_high
                and params["batch_size"] in self.batch_size
                and self.weight_decay_low <= params["weight_decay"] <= self.weight_decay_high
                and params["class_weights"] in self.class_weights
            )
        except (KeyError, TypeError):
            return False

    def suggest(self, trial: Any) -> dict[str, Any]:
        """One point of the space (fixed values of an enqueued trial are taken as they are)."""
        return {
            "lr": trial.suggest_float("lr", self.lr_low, self.lr_high, log=True),
            "epochs": trial.suggest_categorical("epochs", self.epochs),
            "warmup_ratio": trial.suggest_float(
                "warmup_ratio", self.warmup_ratio_low, self.warmup_ratio_high
            ),
            "batch_size": trial.suggest_categorical("batch_size", self.batch_size),
            "weight_decay": trial.suggest_float(
                "weight_decay", self.weight_decay_low, self.weight_decay_high
            ),
            "class_weights": trial.suggest_categorical("class_weights", self.class_weights),
        }

    def default_recipe(self) -> dict[str, Any]:
        """finetuned_model's defaults for the searched fields, clipped into the space (trial 0)."""
        d = HyperParameters()
        clip = lambda v, lo, hi: min(max(v, lo), hi)  # noqa: E731
        return {
            "lr": clip(d.lr, self.lr_low, self.lr_high),
            "epochs": d.epochs if d.epochs in self.epochs else self.epochs[0],
            "warmup_ratio": clip(d.warmup_ratio, self.warmup_ratio_low, self.warmup_ratio_high),
            "batch_size": d.batch_size if d.batch_size in self.batch_size else self.batch_size[0],
            "weight_decay": clip(d.weight_decay, self.weight_decay_low, self.weight_decay_high),
            "class_weights": d.class_weights
            if d.class_weights in self.class_weights
            else self.class_weights[0],
        }

    def sampler_kind(self) -> str:
        """The sampler ``auto`` means: with <= 10 trials TPE's "good" set is one or two trials
        (it then copies them: issue 41 saw trials 3-5 repeat trial 2's choices), a GP models
        the whole space from few points; TPE scales past that.
        """
        if self.sampler != "auto":
            return self.sampler
        return "gp" if self.n_trials <= 10 else "tpe"

    def make_sampler(self, trials_so_far: int = 0) -> Any:
        """The sampler, seeded per run: ``seed`` plus the trials already in the study, so a resumed
        study does not draw again the points its first run drew (a sampler's state is not stored).
        """
        seed = self.seed + trials_so_far
        kind = self.sampler_kind()
        if kind == "gp":
            return optuna.samplers.GPSampler(
                n_startup_trials=self.sampler_startup_trials, seed=seed
            )
        if kind == "qmc":
            return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=self.seed)
        return optuna.samplers.TPESampler(n_startup_trials=self.sampler_startup_trials, seed=seed)

    def pruner_config(self) -> PrunerConfig:
        """Median pruning; a trial reports at 1..reports_per_trial, the fraction of its own
        training done (core/training/trial/pruning.py), so trials of any epochs compare at equal
        shares.
        """
        return PrunerConfig(
            kind=self.pruner,
            startup_trials=self.pruner_startup_trials,
            warmup_steps=self.pruner_warmup_reports + 1,
        )
