"""A tuning trial, seen from the trainer: report validation macro-F1, stop when the pruner says so.

The study lives in durable storage (a journal file or a database), not in this process: the tuning
asset asks for the trial and hands its id in the trainer config (``TrainerConfig.trial``); rank 0
opens the same storage, reports each validation's metric and asks the study's pruner; the decision
is broadcast so every rank stops at the same step. Reports are numbered 1, 2, ... (Optuna's
``step``): trials of different batch sizes validate at the same fractions of their budget but at
different optimizer steps, and the median pruner compares trials at equal ``step``. A pruned run
records ``pruned_at_step`` (the optimizer step) on the trial (the asset then tells the study
PRUNED); its last report is the trial's value either way.

Optuna's own ``optuna_integration.PyTorchLightningPruningCallback`` does the same for the
``lightning`` package; this trainer uses ``pytorch_lightning``, whose ``Trainer`` refuses callbacks
of the other package; and here rank 0 decides for all ranks instead of each rank asking the storage.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytorch_lightning as pl

from finetune_assets.training.config import TrainerConfig, TrialConfig
from finetune_assets.training.study_storage import PRUNED_AT_STEP, make_pruner, open_storage

log = logging.getLogger("finetune_assets.training")


def validation_schedule(config: TrainerConfig) -> dict[str, Any]:
    """The Trainer's validation cadence: once per epoch (or every ``val_check_every_n_steps``), or
    about ``trial.reports`` times a trial.

    With ``max_steps`` the reports are evenly spaced in steps (counted across epochs), so every
    trial reports at the same steps whatever its batch size; when ``reports`` divides ``max_steps``
    the last is on the final step (a trial's last report is the model it ends with). Without it,
    each epoch validates ``ceil(reports / epochs)`` times.
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
    return {
        "check_val_every_n_epoch": 1,
        "val_check_interval": 1.0 / math.ceil(trial.reports / config.epochs),
    }


def callbacks(config: TrainerConfig, rank: int) -> list[pl.Callback]:
    """The trial's callback (none outside a study)."""
    return [TrialPruning(config.trial, rank)] if config.trial is not None else []


class TrialPruning(pl.Callback):
    """Rank 0 reports ``metric`` at each validation, asks the pruner; all ranks stop together."""

    def __init__(self, trial: TrialConfig, rank: int):
        self.config = trial
        self.rank = rank
        self._trial: Any = None
        self._reports = 0  # this trial's validations so far: the step it reports at

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.rank == 0 and self._trial is None:
            import optuna

            study = optuna.load_study(
                study_name=self.config.study_name,
                storage=open_storage(self.config.storage),
                pruner=make_pruner(self.config.pruner),
            )
            self._trial = optuna.trial.Trial(study, self.config.trial_id)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        step = int(trainer.global_step)
        self._reports += 1
        prune = False
        if self.rank == 0:
            value = trainer.callback_metrics.get(self.config.metric)
            if value is None:
                raise RuntimeError(
                    f"trial metric {self.config.metric!r} was not logged by validation"
                )
            self._trial.report(float(value), self._reports)
            prune = bool(self._trial.should_prune())
            log.info(
                "trial %s: %s %.4f (report %d, step %d)%s",
                self.config.trial_id,
                self.config.metric,
                float(value),
                self._reports,
                step,
                " -> pruned" if prune else "",
            )
            if prune:
                self._trial.set_user_attr(PRUNED_AT_STEP, step)
        # one decision: ranks must not leave the loop apart
        if trainer.strategy.broadcast(prune, src=0):
            trainer.should_stop = True
