"""A tuning trial, seen from the trainer: report validation macro-F1, stop when the pruner says so.

The study lives in durable storage (a journal file or a database), not in this process: the tuning
asset asks for the trial and hands its id in the trainer config (``TrainerConfig.trial``); rank 0
opens the same storage, reports validation metrics and asks the study's pruner; the decision is
broadcast so every rank stops at the same step.

Reports are indexed by the share of the trial's own training done: report ``k`` (1..``reports``)
is the first validation at or past ``k / reports`` of the trial's optimizer steps. A 1-epoch and a
3-epoch trial so compare at the same fraction of their budgets (the median pruner compares trials
at equal index), whatever their epochs or batch size. The index is derived from the global step, so
a trial restarted from its checkpoint (a torchrun restart, a resubmitted gang) continues at the
right index; a report it makes again after the restart replaces the pre-crash value in the storage
(``Trial.report`` would keep the first one), so the pruner and the objective see what the resumed
model scores. A pruned run records ``pruned_at_step`` (the optimizer step) on the trial (the asset
then tells the study PRUNED); its last report is the trial's value either way.

Optuna's own ``optuna_integration.PyTorchLightningPruningCallback`` does the same for the
``lightning`` package; this trainer uses ``pytorch_lightning``, whose ``Trainer`` refuses callbacks
of the other package; and here rank 0 decides for all ranks instead of each rank asking the storage.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytorch_lightning as pl

from finetune_assets.core.training.config import TrainerConfig, TrialConfig
from finetune_assets.core.training.trial.study_storage import (
    PRUNED_AT_STEP,
    make_pruner,
    open_storage,
)

log = logging.getLogger("finetune_assets.core.training")


def validation_schedule(config: TrainerConfig) -> dict[str, Any]:
    """The Trainer's validation cadence: once per epoch (or every ``val_check_every_n_steps``), or
    on a grid that has a validation at each ``k / trial.reports`` of a trial's training.

    With ``max_steps`` the validations are evenly spaced in steps (counted across epochs). Without
    it each epoch validates ``reports / gcd(reports, epochs)`` times: every report's fraction is
    then on the grid (6 reports: 6 validations for 1, 2 or 3 epochs alike).
    """
    trial = config.trial
    if trial is None:
        every_n = config.val_check_every_n_steps
        if every_n is None:
            return {"check_val_every_n_epoch": 1}
        # counted in batches by Lightning, across epochs
        return {
            "check_val_every_n_epoch": None,
            "val_check_interval": every_n * config.accumulate_grad_batches,
        }
    if config.max_steps > 0:
        every = max(1, math.ceil(config.max_steps / trial.reports)) * config.accumulate_grad_batches
        return {"check_val_every_n_epoch": None, "val_check_interval": every}
    per_epoch = trial.reports // math.gcd(trial.reports, config.epochs)
    return {"check_val_every_n_epoch": 1, "val_check_interval": 1.0 / per_epoch}


def report_index(step: int, total: int, reports: int) -> int:
    """The report a validation at optimizer ``step`` of ``total`` makes: the number of whole
    ``1 / reports`` shares of the training done (0: none yet, no report).
    """
    if total <= 0:
        return 0
    return min(reports, math.floor(reports * step / total + 1e-9))


def callbacks(config: TrainerConfig, rank: int) -> list[pl.Callback]:
    """The trial's callback (none outside a study)."""
    return [TrialPruning(config.trial, rank)] if config.trial is not None else []


class TrialPruning(pl.Callback):
    """Rank 0 reports ``metric`` at each new share of training, asks the pruner; all ranks stop
    together.
    """

    def __init__(self, trial: TrialConfig, rank: int):
        self.config = trial
        self.rank = rank
        self._study: Any = None
        self._last = 0  # the last report index made (or, after a restart, passed at the resume)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.rank == 0 and self._study is None:
            import optuna  # lazy: the trainer imports this module for every run, not only trials

            self._study = optuna.load_study(
                study_name=self.config.study_name,
                storage=open_storage(self.config.storage),
                pruner=make_pruner(self.config.pruner),
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after a checkpoint restore: reports up to the resumed step were made before the restart
        self._last = report_index(
            int(trainer.global_step), self._total(trainer, pl_module), self.reports
        )

    @property
    def reports(self) -> int:
        return self.config.reports

    @staticmethod
    def _total(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
        """The run's optimizer steps, as the module's scheduler counts them (not
        ``estimated_stepping_batches``, which would break a mid-epoch resume: module.py).
        """
        total = getattr(pl_module, "total_steps", None)
        return int(total()) if callable(total) else int(trainer.estimated_stepping_batches)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        step = int(trainer.global_step)
        index = report_index(step, self._total(trainer, pl_module), self.reports)
        if index <= self._last:  # between two shares: validated, not reported
            return
        self._last = index
        prune = False
        if self.rank == 0:
            prune = self._report(step, index, trainer.callback_metrics.get(self.config.metric))
        # one decision: ranks must not leave the loop apart
        if trainer.strategy.broadcast(prune, src=0):
            trainer.should_stop = True

    def _report(self, step: int, index: int, value: Any) -> bool:
        """Store ``value`` as report ``index`` (replacing a pre-restart one), ask the pruner."""
        import optuna  # lazy: see setup

        if value is None:
            raise RuntimeError(f"trial metric {self.config.metric!r} was not logged by validation")
        self._study._storage.set_trial_intermediate_value(self.config.trial_id, index, float(value))
        trial = optuna.trial.Trial(self._study, self.config.trial_id)  # read back: this value
        prune = bool(trial.should_prune())
        log.info(
            "trial %s: %s %.4f (report %d/%d, step %d)%s",
            self.config.trial_id,
            self.config.metric,
            float(value),
            index,
            self.reports,
            step,
            " -> pruned" if prune else "",
        )
        if prune:
            trial.set_user_attr(PRUNED_AT_STEP, step)
        return prune
