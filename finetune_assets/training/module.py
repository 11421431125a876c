"""The Lightning module: a sequence classifier of the checkpoint's own architecture plus loss, metrics,
optimizers, throughput."""

from __future__ import annotations

import hashlib
import math
import re
import time
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score
from transformers import AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel

from finetune_assets.data.labels import DEFAULT_LABEL_SET, LabelSet
from finetune_assets.data.models import load_sequence_classifier
from finetune_assets.training.config import OptimConfig


def load_classifier(model_dir: str, labels: LabelSet = DEFAULT_LABEL_SET) -> PreTrainedModel:
    """The pretrained folder as a classifier of its own architecture with the version's classes.

    Fails (``WeightsMismatch``) when any encoder weight is missing or unused, instead of training a
    randomly initialised encoder.
    """
    return load_sequence_classifier(model_dir, labels, local_only=True)


def export_classifier(config: PretrainedConfig, state: dict[str, torch.Tensor]) -> PreTrainedModel:
    """The trained weights in a model built from the trained model's own config (and so its class).

    ``state`` is the Lightning module's state dict (``model.`` prefixed); a missing or extra key fails.
    """
    weights = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    model = AutoModelForSequenceClassification.from_config(config)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(f"trained weights do not match {type(model).__name__}: missing={missing}, "
                           f"unexpected={unexpected}")
    return model.eval()


_METRIC_UNSAFE = re.compile(r"[^\w\-. /]")  # MLflow metric names: word characters, - . / and space


def _eval_metrics(prefix: str, num_classes: int) -> MetricCollection:
    return MetricCollection(
        {
            "accuracy": MulticlassAccuracy(num_classes, average="micro"),
            "macro_f1": MulticlassF1Score(num_classes, average="macro"),
            "f1_per_class": MulticlassF1Score(num_classes, average="none"),
            "confusion_matrix": MulticlassConfusionMatrix(num_classes),
        },
        prefix=prefix,
    )


class ReviewClassifier(pl.LightningModule):
    """Owns loss, metrics and optimizers; the HF model is injected so tests and benchmarks can share it."""

    def __init__(
        self, model: PreTrainedModel, optim: OptimConfig, class_weights: list[float] | None = None, seed: int = 0
    ):
        super().__init__()
        self.seed = seed
        self.model = model.train()  # from_pretrained returns eval mode; dropout must be on while training
        # The classes, in id order, from the model's own config (set from the version's label set).
        self.labels: tuple[str, ...] = tuple(model.config.id2label[i] for i in range(model.config.num_labels))
        self.num_classes = len(self.labels)
        self.optim = optim
        if class_weights is not None and len(class_weights) != self.num_classes:
            raise ValueError(f"class_weights needs {self.num_classes} values, got {len(class_weights)}")
        # Training loss only; evaluation losses stay plain cross-entropy so runs remain comparable.
        weight = torch.tensor(class_weights, dtype=torch.float32) if class_weights is not None else None
        self.register_buffer("class_weight", weight, persistent=False)
        self.val_metrics = _eval_metrics("val/", self.num_classes)
        self.test_metrics = _eval_metrics("test/", self.num_classes)
        # Global (all ranks) counters, restored from checkpoints so a resumed run reports run totals.
        self.samples_seen = 0
        self.tokens_seen = 0
        self.train_seconds = 0.0
        self._t_epoch: float | None = None
        self._t_val: float | None = None
        self._val_seconds = 0.0
        self.test_results: dict[str, Any] = {}
        self.start_step = 0

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        return self.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch.get("labels")
        )

    # -- training --------------------------------------------------------------------------

    def on_train_start(self) -> None:
        self.start_step = int(self.global_step)  # > 0 when resumed from a checkpoint

    def on_train_epoch_start(self) -> None:
        self._t_epoch = time.perf_counter()
        self._val_seconds = 0.0

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Dropout masks as a function of (seed, position, rank), not of the RNG's history: a run resumed
        # from a checkpoint draws the same masks as an uninterrupted one, so it ends with the same weights.
        key = f"{self.seed}/{self.current_epoch}/{batch_idx}/{self.global_step}/{self.global_rank}"
        torch.manual_seed(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1)

    def train_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy, weighted per class when ``class_weights`` were given (mean over the batch's weights)."""
        weight = self.class_weight.to(logits.dtype) if self.class_weight is not None else None
        return F.cross_entropy(logits.view(-1, self.num_classes), labels.view(-1), weight=weight)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self({k: v for k, v in batch.items() if k != "labels"})
        loss = self.train_loss(out.logits, batch["labels"])
        counts = torch.tensor(
            [batch["labels"].shape[0], int(batch["num_tokens"])], dtype=torch.float64, device=self.device
        )
        counts = self.trainer.strategy.reduce(counts, reduce_op="sum")  # tiny all-reduce: exact global totals
        self.samples_seen += int(counts[0].item())
        self.tokens_seen += int(counts[1].item())
        bs = batch["labels"].shape[0]
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=bs, sync_dist=False)
        self.log("train/samples_seen", float(self.samples_seen), on_step=True, on_epoch=False, batch_size=bs)
        if self._t_epoch is not None:
            elapsed = self.train_seconds + time.perf_counter() - self._t_epoch - self._val_seconds
            if elapsed > 0 and self.samples_seen:
                self.log("throughput/samples_per_sec", self.samples_seen / elapsed, on_step=True, batch_size=bs)
                self.log("throughput/tokens_per_sec", self.tokens_seen / elapsed, on_step=True, batch_size=bs)
        return loss

    def on_train_epoch_end(self) -> None:
        if self._t_epoch is not None:
            self.train_seconds += time.perf_counter() - self._t_epoch - self._val_seconds
            self._t_epoch = None
        self.log("epoch/samples_seen", float(self.samples_seen))

    # -- evaluation ------------------------------------------------------------------------

    def on_validation_start(self) -> None:
        self._t_val = time.perf_counter()

    def on_validation_end(self) -> None:
        if self._t_val is not None and self._t_epoch is not None:  # validation inside a train epoch
            self._val_seconds += time.perf_counter() - self._t_val
        self._t_val = None

    def _eval_step(self, batch: dict[str, torch.Tensor], metrics: MetricCollection, prefix: str) -> None:
        out = self(batch)
        preds = out.logits.argmax(dim=-1)
        metrics.update(preds, batch["labels"])
        self.log(f"{prefix}loss", out.loss, on_epoch=True, sync_dist=True, batch_size=batch["labels"].shape[0])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics, "val/")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics, "test/")

    def _log_eval(self, metrics: MetricCollection) -> dict[str, Any]:
        values = metrics.compute()  # torchmetrics syncs the states across ranks
        prefix = metrics.prefix or ""
        result = {
            "accuracy": float(values[f"{prefix}accuracy"]),
            "macro_f1": float(values[f"{prefix}macro_f1"]),
            "f1_per_class": {self.labels[i]: float(v) for i, v in enumerate(values[f"{prefix}f1_per_class"])},
            "confusion_matrix": values[f"{prefix}confusion_matrix"].long().tolist(),
        }
        self.log(f"{prefix}accuracy", result["accuracy"], sync_dist=False)
        self.log(f"{prefix}macro_f1", result["macro_f1"], sync_dist=False)
        for name, v in result["f1_per_class"].items():
            self.log(f"{prefix}f1_{_METRIC_UNSAFE.sub('_', name)}", v, sync_dist=False)
        metrics.reset()
        return result

    def on_validation_epoch_end(self) -> None:
        self._log_eval(self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self.test_results = self._log_eval(self.test_metrics)

    # -- optimisation ----------------------------------------------------------------------

    def configure_optimizers(self) -> dict[str, Any]:
        o = self.optim
        if o.name == "adadelta":  # the seed's recipe
            optimizer = torch.optim.Adadelta(self.parameters(), lr=o.lr, weight_decay=o.weight_decay)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=o.gamma)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=o.lr
        )
        total = max(1, self._total_steps())
        warmup = int(total * o.warmup_ratio)

        def linear(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _total_steps(self) -> int:
        """Optimizer steps of the whole run, computed from the train dataset's length.

        Not ``trainer.estimated_stepping_batches``: it builds the train loader before a checkpoint is
        restored, and Lightning then never hands that loader its saved state, so a mid-epoch resume
        would restart the epoch from its first sample (samples repeated and skipped).
        """
        t = self.trainer
        datasets = getattr(t.datamodule, "datasets", {}) if t.datamodule is not None else {}
        if "train" not in datasets:
            return int(t.estimated_stepping_batches)
        batches = math.ceil(len(datasets["train"]) / t.datamodule.config.batch_size)  # per rank, as the loader
        limit = t.limit_train_batches
        batches = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
        steps = math.ceil(batches / t.accumulate_grad_batches) * max(t.max_epochs or 1, 1)
        return min(steps, t.max_steps) if t.max_steps != -1 else steps

    # -- checkpoint state ------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        elapsed = self.train_seconds
        if self._t_epoch is not None:
            elapsed += time.perf_counter() - self._t_epoch - self._val_seconds
        checkpoint["review_classifier"] = {
            "samples_seen": self.samples_seen,
            "tokens_seen": self.tokens_seen,
            "train_seconds": elapsed,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("review_classifier", {})
        self.samples_seen = int(state.get("samples_seen", 0))
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.train_seconds = float(state.get("train_seconds", 0.0))
