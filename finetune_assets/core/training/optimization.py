"""The optimizer and learning-rate schedule that :class:`HyperParameters` asks for (what
``ReviewClassifier.configure_optimizers`` returns to Lightning).

AdamW, the default: weight decay on weights only (by parameter name), a linear warmup, then linear
or cosine decay to 0 or a constant rate, stepped per optimizer step. Adadelta: the original
notebook's recipe, StepLR stepped per epoch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from finetune_assets.core.training.hyperparameters import HyperParameters

log = logging.getLogger(__name__)


def decays(name: str) -> bool:
    """Weight decay by parameter *name*: not biases, not norms (any layer-norm spelling).

    By name, not ``p.ndim``: under FSDP with ``use_orig_params`` a parameter may be a flat 1-D
    shard, and a shape rule would then switch decay off for every weight.
    """
    parts = name.lower().split(".")
    return parts[-1] != "bias" and not any("norm" in part for part in parts[-2:])


def lr_factor(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """The learning rate's multiplier at each optimizer step: a linear warmup over ``warmup``
    steps, then ``schedule`` (linear, cosine or constant) until step ``total``.
    """

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if schedule == "constant":
            return 1.0
        done = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * done))
        return max(0.0, 1.0 - done)  # linear: (total - step) / (total - warmup)

    return factor


def adadelta_recipe(parameters: Iterable[torch.nn.Parameter], o: HyperParameters) -> dict[str, Any]:
    """The Adadelta recipe (lr 1.0, no warmup): the rate decays by ``gamma`` each epoch."""
    optimizer = torch.optim.Adadelta(parameters, lr=o.lr, weight_decay=o.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=o.gamma)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def adamw_recipe(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
    o: HyperParameters,
    total_steps: int,
    options: dict[str, Any],
) -> dict[str, Any]:
    """AdamW over the trainable parameters (decayed as :func:`decays` says) with the schedule of
    :func:`lr_factor` over ``total_steps``; ``options``: extra AdamW arguments (``fused``).
    """
    decay, no_decay = [], []
    for name, p in named_parameters:
        if p.requires_grad:
            (decay if decays(name) else no_decay).append(p)
    log.info(
        "AdamW: %d tensors with weight decay %g, %d without",
        len(decay),
        o.weight_decay,
        len(no_decay),
    )
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": o.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=o.lr,
        **options,
    )
    total = max(1, total_steps)
    factor = lr_factor(o.lr_schedule, int(total * o.warmup_ratio), total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
