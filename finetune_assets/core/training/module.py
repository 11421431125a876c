"""The Lightning module: a sequence classifier of the checkpoint's own architecture plus loss,
metrics and optimizers (:mod:`.optimization`); the process layout its checkpoints record:
:mod:`.checkpoints.layout`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
)
from transformers import AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel

from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET, LabelSet
from finetune_assets.core.prep.pretrained import load_sequence_classifier
from finetune_assets.core.training.checkpoints.layout import check_resume_layout, layout_of
from finetune_assets.core.training.data.collate import PAD_LABEL
from finetune_assets.core.training.data.sharding import (
    fsdp_mesh,
    mixed_precision,
    set_gradient_sync,
    shard_encoder,
)
from finetune_assets.core.training.device_settings import adamw_options, compile_blocks
from finetune_assets.core.training.hyperparameters import HyperParameters
from finetune_assets.core.training.optimization import adadelta_recipe, adamw_recipe
from finetune_assets.core.training.throughput import CHECKPOINT_KEY

log = logging.getLogger(__name__)


def load_classifier(
    model_dir: str, labels: LabelSet = DEFAULT_LABEL_SET, attn_implementation: str | None = None
) -> PreTrainedModel:
    """The pretrained folder as a classifier of its own architecture with the version's classes.

    Fails (``WeightsMismatch``) when any encoder weight is missing or unused, instead of training a
    randomly initialised encoder.
    """
    return load_sequence_classifier(
        model_dir, labels, local_only=True, attn_implementation=attn_implementation
    )


EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def export_classifier(
    config: PretrainedConfig, state: dict[str, torch.Tensor], dtype: str = "float32"
) -> PreTrainedModel:
    """The trained weights in a model built from the trained model's own config (and so its class),
    saved as ``dtype`` (``export_dtype``).

    Built in float32 whatever ``config.dtype`` says (a bf16 checkpoint's config would otherwise
    build bf16 and round the trained fp32 weights), then cast to the chosen export dtype.
    ``state`` is the Lightning module's state dict (``model.`` prefixed); a missing or extra key
    fails.
    """
    weights = {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(
            f"trained weights do not match {type(model).__name__}: missing={missing}, "
            f"unexpected={unexpected}"
        )
    model = model.to(EXPORT_DTYPES[dtype])
    model.config.dtype = EXPORT_DTYPES[dtype]
    return model.eval()


_METRIC_UNSAFE = re.compile(r"[^\w\-. /]")  # MLflow metric names: word characters, - . / and space


def _eval_metrics(prefix: str, num_classes: int) -> MetricCollection:
    # PAD_LABEL marks evaluation padding (datamodule.RankBlock): counted by no metric.
    ignore = PAD_LABEL
    return MetricCollection(
        {
            "accuracy": MulticlassAccuracy(num_classes, average="micro", ignore_index=ignore),
            "macro_f1": MulticlassF1Score(num_classes, average="macro", ignore_index=ignore),
            "f1_per_class": MulticlassF1Score(num_classes, average="none", ignore_index=ignore),
            "confusion_matrix": MulticlassConfusionMatrix(num_classes, ignore_index=ignore),
        },
        prefix=prefix,
    )


class NonFiniteLoss(FloatingPointError):
    """A training loss that is NaN or infinite: the run stops, naming where (``nonfinite_loss``)."""


class ReviewClassifier(pl.LightningModule):
    """Owns loss, metrics and optimizers; the HF model is injected so tests and benchmarks can
    share it.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        optim: HyperParameters,
        class_weights: list[float] | None = None,
        seed: int = 0,
    ):
        super().__init__()
        self.seed = seed
        # from_pretrained returns eval mode; dropout must be on while training
        self.model = model.train()
        # The classes, in id order, from the model's own config (set from the version's label set).
        self.labels: tuple[str, ...] = tuple(
            model.config.id2label[i] for i in range(model.config.num_labels)
        )
        self.num_classes = len(self.labels)
        self.optim = optim
        if class_weights is not None and len(class_weights) != self.num_classes:
            raise ValueError(
                f"class_weights needs {self.num_classes} values, got {len(class_weights)}"
            )
        # Training loss only; evaluation losses stay plain cross-entropy so runs remain comparable.
        weight = (
            torch.tensor(class_weights, dtype=torch.float32) if class_weights is not None else None
        )
        self.register_buffer("class_weight", weight, persistent=False)
        self.val_metrics = _eval_metrics("val/", self.num_classes)
        self.test_metrics = _eval_metrics("test/", self.num_classes)
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()  # per sample, padding weighted 0
        self.test_results: dict[str, Any] = {}
        self.compiled_blocks = 0  # encoder blocks under torch.compile (``compile: true``)
        self.gradient_syncs = {True: 0, False: 0}  # FSDP micro-batches with / without grad sync
        # nonfinite_loss "stop": (step, batch, epoch) of the first non-finite loss, on the device
        # (read at the log interval); "skip": the window being accumulated had one, and a count
        self._first_nonfinite: torch.Tensor | None = None
        self._window_nonfinite = False
        self.nonfinite_skipped = 0

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        # No labels to the model: losses are computed here (class weights, masked repeats and
        # padding).
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])

    # -- training --------------------------------------------------------------------------

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Dropout masks as a function of (seed, position, rank), not of the RNG's history: a run
        # resumed from a checkpoint draws the same masks as an uninterrupted one, so it ends with
        # the same weights.
        key = f"{self.seed}/{self.current_epoch}/{batch_idx}/{self.global_step}/{self.global_rank}"
        torch.manual_seed(
            int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1
        )
        # the epoch loop's own rule (Lightning steps on the last batch of an epoch too)
        sync = not self.trainer.fit_loop.epoch_loop._should_accumulate()
        if set_gradient_sync(self.model, sync):
            self.gradient_syncs[sync] += 1

    def on_train_end(self) -> None:
        if sum(self.gradient_syncs.values()) and self.global_rank == 0:
            log.info(
                "FSDP2 gradient sync: %d micro-batches reduced, %d accumulated without sync",
                self.gradient_syncs[True],
                self.gradient_syncs[False],
            )

    def train_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy in fp32, weighted per class when ``class_weights`` were given (mean over
        the batch's weights).

        fp32 whatever the precision: bf16 would round the class weights (and the loss) to 3 digits.
        """
        logits, labels = logits.float().view(-1, self.num_classes), labels.view(-1)
        # streaming's repeated samples (streaming_loader.repeated_positions) count nowhere
        kept = labels != PAD_LABEL
        weight = (
            self.class_weight[labels.clamp(min=0)]
            if self.class_weight is not None
            else torch.ones_like(logits[:, 0])
        )
        weight = weight * kept
        per_sample = F.cross_entropy(logits, labels, ignore_index=PAD_LABEL, reduction="none")
        # 0, not NaN, for an all-repeat batch
        return (per_sample * weight).sum() / weight.sum().clamp(min=1e-12)

    def _watch_nonfinite(self, loss: torch.Tensor, batch_idx: int, check: bool) -> None:
        """``nonfinite_loss``: record the first non-finite loss on the device (no sync) and raise
        at the log interval (``check``), on every rank together; or, for ``skip``, mark the
        accumulation window (one all-reduced flag per micro-batch: every rank skips the same step).
        """
        bad = ~torch.isfinite(loss.detach())
        if self.optim.nonfinite_loss == "skip":
            flag = self.trainer.strategy.reduce(bad.float(), reduce_op="sum")
            if float(flag) > 0:
                self._window_nonfinite = True
                if self.global_rank == 0:
                    log.warning(
                        "non-finite training loss at step %d, batch %d (epoch %d): step skipped",
                        self.global_step,
                        batch_idx,
                        self.current_epoch,
                    )
            return
        where = torch.tensor(
            [self.global_step, batch_idx, self.current_epoch], device=loss.device, dtype=torch.long
        )
        if self._first_nonfinite is None:
            self._first_nonfinite = torch.full_like(where, -1)
        first = self._first_nonfinite
        self._first_nonfinite = torch.where(bad & (first[0] < 0), where, first)
        if check:
            self.raise_if_nonfinite()

    def raise_if_nonfinite(self) -> None:
        """Raise :class:`NonFiniteLoss` if any rank saw a non-finite loss (a collective)."""
        if self._first_nonfinite is None or self.optim.nonfinite_loss != "stop":
            return
        # the earliest over ranks: -1 (none) becomes large so that min picks a real one
        first = torch.where(self._first_nonfinite < 0, 2**62, self._first_nonfinite)
        first = self.trainer.strategy.reduce(first, reduce_op="min")  # gloo/nccl: min
        if int(first[0]) < 2**62:
            step, batch, epoch = (int(v) for v in first)
            raise NonFiniteLoss(
                f"non-finite training loss (NaN or inf) at step {step}, batch {batch} of epoch "
                f"{epoch}: the run stops (nonfinite_loss 'stop'); lower lr, set "
                "gradient_clip_val, check the data of that batch, or nonfinite_loss 'skip'"
            )

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any):
        if self.optim.nonfinite_loss != "skip":
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        optimizer_closure()  # the window's last forward + backward (every rank: DDP reduces)
        if self._window_nonfinite:
            optimizer.zero_grad(set_to_none=True)
            self.nonfinite_skipped += 1
            self._window_nonfinite = False
            return None
        return optimizer.step(closure=lambda: None)

    def on_train_epoch_end(self) -> None:
        self.raise_if_nonfinite()
        if self.optim.nonfinite_loss == "skip":
            self.log("train/nonfinite_skipped", float(self.nonfinite_skipped), sync_dist=False)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self(batch)
        loss = self.train_loss(out.logits, batch["labels"])
        every = self.trainer.log_every_n_steps * self.trainer.accumulate_grad_batches
        at_log_interval = (batch_idx + 1) % every == 0
        self._watch_nonfinite(loss, batch_idx, check=at_log_interval)
        # The mean over all ranks, reduced once per log interval and once per epoch (not every
        # step).
        reduced = {"batch_size": batch["labels"].shape[0], "sync_dist": True}
        if at_log_interval:
            self.log("train/loss_step", loss.detach(), on_step=True, on_epoch=False, **reduced)
        self.log("train/loss_epoch", loss.detach(), on_step=False, on_epoch=True, **reduced)
        return loss  # samples, tokens and seconds are counted by callbacks.Throughput

    # -- evaluation ------------------------------------------------------------------------

    def _eval_step(
        self, batch: dict[str, torch.Tensor], metrics: MetricCollection, loss: MeanMetric
    ) -> None:
        labels = batch["labels"]
        logits = self(batch).logits.float()
        metrics.update(logits.argmax(dim=-1), labels)  # PAD_LABEL samples are ignored
        per_sample = F.cross_entropy(logits, labels, ignore_index=PAD_LABEL, reduction="none")
        loss.update(per_sample, weight=(labels != PAD_LABEL).float())

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics, self.val_loss)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics, self.test_loss)

    def _log_eval(self, metrics: MetricCollection, loss: MeanMetric) -> dict[str, Any]:
        # torchmetrics syncs the states across ranks (a rank may have none)
        values = metrics.compute()
        prefix = metrics.prefix or ""
        self.log(f"{prefix}loss", float(loss.compute()), sync_dist=False)
        loss.reset()
        result = {
            "accuracy": float(values[f"{prefix}accuracy"]),
            "macro_f1": float(values[f"{prefix}macro_f1"]),
            "f1_per_class": {
                self.labels[i]: float(v) for i, v in enumerate(values[f"{prefix}f1_per_class"])
            },
            "confusion_matrix": values[f"{prefix}confusion_matrix"].long().tolist(),
        }
        self.log(f"{prefix}accuracy", result["accuracy"], sync_dist=False)
        self.log(f"{prefix}macro_f1", result["macro_f1"], sync_dist=False)
        for name, v in result["f1_per_class"].items():
            self.log(f"{prefix}f1_{_METRIC_UNSAFE.sub('_', name)}", v, sync_dist=False)
        metrics.reset()
        return result

    def on_validation_epoch_end(self) -> None:
        self._log_eval(self.val_metrics, self.val_loss)

    def on_test_epoch_end(self) -> None:
        self.test_results = self._log_eval(self.test_metrics, self.test_loss)

    # -- optimisation ----------------------------------------------------------------------

    def configure_optimizers(self) -> dict[str, Any]:
        if self.optim.optimizer == "adadelta":
            return adadelta_recipe(self.parameters(), self.optim)
        # fused on CUDA (DDP; FSDP's sharded DTensor parameters keep the default)
        trainer = getattr(self, "_trainer", None)  # None when configured outside a Trainer
        clips = bool(trainer and trainer.gradient_clip_val) and "mixed" in str(trainer.precision)
        options = adamw_options(self.device, clips) if self.device_mesh is None else {}
        return adamw_recipe(self.named_parameters(), self.optim, self.total_steps(), options)

    def total_steps(self) -> int:
        """Optimizer steps of the whole run, computed from the train dataset's length.

        Not ``trainer.estimated_stepping_batches``: it builds the train loader before a checkpoint
        is restored, and Lightning then never hands that loader its saved state, so a mid-epoch
        resume would restart the epoch from its first sample (samples repeated and skipped).
        """
        t = self.trainer
        datasets = getattr(t.datamodule, "datasets", {}) if t.datamodule is not None else {}
        if "train" not in datasets:
            return int(t.estimated_stepping_batches)
        # per rank, as the loader
        batches = math.ceil(len(datasets["train"]) / t.datamodule.config.batch_size)
        limit = t.limit_train_batches
        batches = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
        steps = math.ceil(batches / t.accumulate_grad_batches) * max(t.max_epochs or 1, 1)
        return min(steps, t.max_steps) if t.max_steps != -1 else steps

    # -- compilation and sharding ----------------------------------------------------------

    def configure_model(self) -> None:
        """``compile: true``: compile each encoder block (:func:`.device_settings.compile_blocks`);
        then under ``strategy: fsdp`` shard the encoder on the strategy's mesh (once: see
        :mod:`.sharding`). Compile first, then shard: torchtitan's order (FSDP2's hooks stay
        outside the compiled blocks).
        """
        if self.optim.compile:
            self.compiled_blocks = compile_blocks(self.model)
        mesh = self.device_mesh  # set by Lightning's ModelParallelStrategy only
        if mesh is not None:
            policy = mixed_precision(self.optim.precision)
            if shard_encoder(self.model, fsdp_mesh(mesh), policy) and self.global_rank == 0:
                log.info(
                    "FSDP2 on mesh %s, mixed precision %s",
                    tuple(mesh.shape),
                    f"param {policy.param_dtype}, reduce {policy.reduce_dtype}"
                    if policy
                    else "off (fp32)",
                )

    # -- checkpoint state ------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Beside callbacks.Throughput's run totals, under the same key.
        checkpoint.setdefault(CHECKPOINT_KEY, {}).update(
            layout_of(self.trainer), nonfinite_skipped=self.nonfinite_skipped
        )

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get(CHECKPOINT_KEY, {})
        self.nonfinite_skipped = int(state.get("nonfinite_skipped", 0))
        check_resume_layout(state, self.trainer, checkpoint)
