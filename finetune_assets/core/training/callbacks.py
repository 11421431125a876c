"""The trainer's side jobs as Lightning callbacks, so ``train()`` and ``ReviewClassifier`` stay
about training.

- :class:`~.throughput.Throughput` (in :mod:`.throughput`): run totals and the steady-state window.
- :class:`Progress`: rank 0 writes one progress line at a steady time interval (step/total, epoch,
  loss, samples/s, ETA) to the log, which both launchers forward to the Dagster log, and the same
  numbers as ``progress/*`` metrics to MLflow.
- :class:`BoundaryCheckpoint`: ``last.ckpt`` only right after an optimizer step (never inside a
  gradient accumulation window), with no per-batch host sync.
- :class:`~.export.HuggingFaceCheckpointer` (in :mod:`.export`): at the end of fit, the trained
  weights as a Hugging Face folder; then the MLflow artifacts, the transformers-flavor model and its
  registered version, and the folder published under ``output_dir/model``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from finetune_assets.core.training import PROGRESS
from finetune_assets.core.training.throughput import CHECKPOINT_KEY, Throughput

__all__ = ["CHECKPOINT_KEY", "BoundaryCheckpoint", "Progress", "Throughput"]

log = logging.getLogger("finetune_assets.core.training")

# -- progress ------------------------------------------------------------------------------------


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress(pl.Callback):
    """Rank 0: one line every ``every_seconds`` of training, and once at the end.

    ``progress: step 120/400 (30%) | epoch 1/2 | loss 0.4123 | 38.2 samples/s | ETA 0:02:11``: the
    loss is rank 0's mean since the last line, samples/s and ETA are over this start's steps (a
    resumed run does not count the steps it skipped). Time-based, not step-based, so a slow CPU run
    and a fast GPU run both report at a pace a person can read.
    """

    def __init__(
        self, throughput: Throughput, every_seconds: float = 30.0, logger: logging.Logger = log
    ):
        self.throughput = throughput
        self.every_seconds = every_seconds
        self._log = logger
        self._total: int | None = None
        self._t0 = self._last = 0.0
        self._step0 = 0
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        total = (
            pl_module.total_steps()
            if hasattr(pl_module, "total_steps")
            else trainer.estimated_stepping_batches
        )
        self._total = int(total) if math.isfinite(total) else None
        if trainer.max_steps and trainer.max_steps > 0:
            self._total = min(self._total or trainer.max_steps, trainer.max_steps)
        self._t0 = self._last = time.perf_counter()
        self._step0 = int(trainer.global_step)

    # Lightning's hook signature: (trainer, pl_module, outputs, batch, batch_idx)
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.is_global_zero:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        # summed on the device: read (one host sync) only when reporting
        if isinstance(loss, torch.Tensor):
            self._loss_sum = loss.detach().float() + (
                self._loss_sum if self._loss_sum is not None else 0.0
            )
            self._loss_count += 1
        if time.perf_counter() - self._last >= self.every_seconds:
            self.report(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.report(trainer)

    def report(self, trainer: pl.Trainer) -> str:
        now = time.perf_counter()
        step = int(trainer.global_step)
        rate_steps = (step - self._step0) / max(now - self._t0, 1e-9)
        samples_per_sec = self.throughput.estimated_samples(trainer.world_size) / max(
            self.throughput.elapsed(), 1e-9
        )
        loss = (
            float(self._loss_sum) / self._loss_count if self._loss_sum is not None else float("nan")
        )
        total = self._total
        eta = (total - step) / rate_steps if total is not None and rate_steps > 0 else float("inf")
        if total is not None and step >= total:
            eta = 0.0
        where = (
            f"step {step}/{total} ({step / max(total, 1):.0%})"
            if total is not None
            else f"step {step}"
        )
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        # 1 past at the end
        epoch = (
            trainer.current_epoch + 1 if epochs is None else min(trainer.current_epoch + 1, epochs)
        )
        line = (
            f"{PROGRESS} {where} | epoch {epoch}/{epochs or '?'} | loss {loss:.4f} | "
            f"{samples_per_sec:.1f} samples/s | ETA {_clock(eta)}"
        )
        self._log.info(line)
        if trainer.logger:
            metrics = {
                "progress/fraction": step / total if total else 0.0,
                "progress/samples_per_sec": samples_per_sec,
            }
            if math.isfinite(eta):
                metrics["progress/eta_seconds"] = eta
            if math.isfinite(loss):
                metrics["progress/loss"] = loss
            trainer.logger.log_metrics(metrics, step=step)
        self._last, self._loss_sum, self._loss_count = now, None, 0
        return line


# -- checkpoints -----------------------------------------------------------------------------------


class BoundaryCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, consulted only on the batch whose optimizer step just ran.

    Lightning's own trigger runs at every micro-batch end, and so
    - can save inside a gradient accumulation window (the time trigger, or the step trigger on the
      first micro-batch after a resume, since the step already saved is not in its state): the
      loader state then counts micro-batches whose gradients the checkpoint lacks, and a resume is
      not exact;
    - with ``train_time_interval`` broadcasts rank 0's clock decision every micro-batch: a host
      round trip per batch on a GPU.
    Here a save happens only where ``global_step`` just advanced (a Python int: no sync), and the
    time trigger is evaluated (and broadcast) only every ``time_check_every_n_steps`` steps.
    """

    def __init__(self, *args: Any, time_check_every_n_steps: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.time_check_every_n_steps = max(1, time_check_every_n_steps)
        self._step_seen: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # a resumed run's step was saved by the checkpoint it resumed from
        self._step_seen = int(trainer.global_step)
        self._last_global_step_saved = int(trainer.global_step)

    # Lightning's hook signature: (trainer, pl_module, outputs, batch, batch_idx)
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = int(trainer.global_step)
        if step == self._step_seen:
            return  # inside an accumulation window: no optimizer step on this batch
        self._step_seen = step
        if self._train_time_interval is not None and step % self.time_check_every_n_steps:
            return  # the clock is read (and rank 0's decision broadcast) only every N steps
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
