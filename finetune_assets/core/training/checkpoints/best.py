"""The best validation's weights, not the last: model selection and early stopping.

Lightning's own callbacks do the work: ``ModelCheckpoint(monitor="val/macro_f1", mode="max",
save_top_k=1)`` keeps the best validation's full state in ``{checkpoint_dir}/best/best.ckpt`` (one
file, replaced atomically by the checkpoint IO, so a crash leaves the previous best or the new one;
under ``checkpoint_format: sharded`` a DCP folder, swapped in whole: ``sharding.save_sharded``),
and
``EarlyStopping`` stops after ``early_stopping_patience`` validations without a better value. Both
are stateful: their state (best score and path, the patience count) is in every ``last.ckpt``, so a
resumed run goes on counting where the crashed one was.

:class:`BestModel` adds what they do not: the validation curve (checkpointed too) and, at the
end of fit, the best checkpoint's weights loaded into the module on every rank. It runs before the
Hugging Face export (``on_fit_end``, in callback order), so the exported model, the test scores
and the final ``last.ckpt`` are all the best validation's.
"""

from __future__ import annotations

import logging
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.plugins.io import AsyncCheckpointIO
from pytorch_lightning.trainer.states import TrainerFn

from finetune_assets.core.io.contracts import ModelSelection, ValidationPoint
from finetune_assets.core.training.checkpoints import trainer_files as files
from finetune_assets.core.training.config import SELECTION_METRIC, TrainerConfig
from finetune_assets.core.training.data.sharding import (
    is_sharded_checkpoint,
    load_sharded_weights,
    reshard,
)

log = logging.getLogger("finetune_assets.core.training")

BEST = "best"  # {checkpoint_dir}/best/best.ckpt
# A folder of its own: Lightning warns when a top-k checkpoint's folder is not empty at the start
# (a resume's is: quiet_known_notices), and the run's folder holds last.ckpt and the MLflow run id.
BEST_DIR = "best"


class BestModel(pl.Callback):
    """Records every validation; at fit end puts the best one's weights in the module."""

    def __init__(self, config: TrainerConfig, validate: bool):
        self.select = config.select_model
        self.patience = config.early_stopping_patience
        self.curve: list[ValidationPoint] = []
        self.note: str | None = None
        self.loaded_step: int | None = None
        self.checkpoint: ModelCheckpoint | None = None
        self.early_stopping: EarlyStopping | None = None
        if not validate:
            self.note = "no validation split: the last weights were exported"
            return
        if self.select == "best":
            # Full state, not weights only: under FSDP Lightning's loader restores the optimizer
            # with the module and needs its state in the file.
            self.checkpoint = ModelCheckpoint(
                dirpath=files.local_path(config.checkpoint_dir).rstrip("/") + "/" + BEST_DIR,
                filename=BEST,
                monitor=SELECTION_METRIC,
                mode="max",
                save_top_k=1,
                save_last=False,
                auto_insert_metric_name=False,
            )
        if config.trial is not None:
            # A study's trial is stopped by its pruner, on equal budgets; early stopping would cut
            # trials short at unequal fractions of their training.
            self.patience = None
        if self.patience is not None:
            # Checked after each validation only (patience counts validations) and not strict: a
            # run that ends before its first validation (max_steps inside the first epoch) has
            # no metric to judge and exports its last weights instead of failing the run.
            self.early_stopping = EarlyStopping(
                monitor=SELECTION_METRIC,
                mode="max",
                patience=self.patience,
                min_delta=0.0,
                strict=False,
                check_on_train_epoch_end=False,
            )

    def callbacks(self) -> list[pl.Callback]:
        """This callback first (its ``on_fit_end`` must precede the export), then Lightning's."""
        return [self, *(c for c in (self.checkpoint, self.early_stopping) if c is not None)]

    # -- the curve -------------------------------------------------------------------------------

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        value = trainer.callback_metrics.get(SELECTION_METRIC)
        if value is None:
            return
        self.curve.append(
            ValidationPoint(
                epoch=int(trainer.current_epoch) + 1,
                step=int(trainer.global_step),
                value=float(value),
            )
        )

    def state_dict(self) -> dict[str, Any]:
        return {"curve": [p.model_dump() for p in self.curve]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.curve = [ValidationPoint.model_validate(p) for p in state_dict.get("curve", [])]

    # -- the weights ---------------------------------------------------------------------------

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.checkpoint is None:
            return
        path = self.checkpoint.best_model_path
        io = trainer.strategy.checkpoint_io
        if isinstance(io, AsyncCheckpointIO):
            io.teardown()  # waits for the background writes: best.ckpt is complete
        if not path or not files.exists(path):
            self.note = "no best checkpoint was written: the last weights were exported"
            if trainer.is_global_zero:
                log.warning("%s", self.note)
            return
        # every rank loads (a collective under FSDP); weights only: no pickled code runs
        reshard(pl_module)
        if is_sharded_checkpoint(path):  # checkpoint_format sharded: resharded to this mesh
            self.loaded_step = load_sharded_weights(trainer.strategy.model, path)
        else:  # an object store's best.ckpt: a node-local copy (FSDP's loader needs a path)
            path = files.node_local_copy(path, "best.ckpt")
            state = trainer.strategy.load_checkpoint(path, weights_only=True)
            trainer.strategy.load_model_state_dict(state, strict=True)
            self.loaded_step = int(state.get("global_step", -1))
        if trainer.is_global_zero:
            best = self.best_point()
            log.info(
                "exporting the best validation's weights: %s %.4f at epoch %s, step %s (of %d "
                "validations)",
                SELECTION_METRIC,
                self.checkpoint.best_model_score or float("nan"),
                best.epoch if best else "?",
                self.loaded_step,
                len(self.curve),
            )

    # -- the record ----------------------------------------------------------------------------

    def best_point(self) -> ValidationPoint | None:
        """The validation whose weights were exported (the first of equal values: Lightning's
        "better" is strictly greater); with ``select_model: last``, still the best one seen.
        """
        if self.loaded_step is not None:
            for point in self.curve:
                if point.step == self.loaded_step:
                    return point
        return max(self.curve, key=lambda p: p.value, default=None)

    def selection(self) -> ModelSelection:
        # EarlyStopping's stopped_epoch is 0-based and 0 also means "not stopped": read the reason
        stopped = (
            self.early_stopping is not None
            and self.early_stopping.stopping_reason_message is not None
        )
        best = self.best_point()
        exported_best = self.checkpoint is not None and self.loaded_step is not None
        return ModelSelection(
            metric=SELECTION_METRIC,
            selected="best" if exported_best else "last",
            best_epoch=best.epoch if best else None,
            best_step=best.step if best else None,
            best_value=best.value if best else None,
            early_stopped=stopped,
            early_stopping_patience=self.patience,
            stopped_at_epoch=self.early_stopping.stopped_epoch + 1 if stopped else None,
            curve=list(self.curve),
            note=self.note,
        )

    def mlflow_metrics(self) -> dict[str, float]:
        """The selection as MLflow metrics (the curve itself is ``val/macro_f1``'s history)."""
        s = self.selection()
        out = {"selection/early_stopped": float(s.early_stopped)}
        if s.best_epoch is not None:
            out["selection/best_epoch"] = float(s.best_epoch)
            out["selection/best_step"] = float(s.best_step)
            out["selection/best_val_macro_f1"] = float(s.best_value)
        return out
