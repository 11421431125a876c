"""What the trainer sets differently on a GPU, in one place (CPU runs keep the config as given).

- ``eval_batch_size`` unset: the training batch on CPU; 4 x on a GPU (evaluation keeps no
  activations for a backward pass, so a bigger batch fits and keeps the device busy).
- AdamW ``fused=True`` on CUDA under DDP: one kernel for the whole update, not a loop of small
  ones.
- DDP under ``bf16-mixed`` on CUDA: gradients all-reduced in bf16 (torch's ``bf16_compress_hook``),
  half the bytes on the wire; the optimizer still sees fp32 gradients.
- Pinned host memory for the loaders on CUDA (``run.train``).

Measured by ``benchmarks/gpu/`` when a GPU is lent.
"""

from __future__ import annotations

from typing import Any

import torch

EVAL_BATCH_FACTOR_GPU = 4


def on_gpu(accelerator: str) -> bool:
    return accelerator != "cpu" and torch.cuda.is_available()


def eval_batch_size(batch_size: int, eval_batch_size: int | None, gpu: bool) -> int:
    if eval_batch_size is not None:
        return eval_batch_size
    return batch_size * EVAL_BATCH_FACTOR_GPU if gpu else batch_size


def adamw_options(device: torch.device) -> dict[str, Any]:
    return {"fused": True} if device.type == "cuda" else {}


def ddp_strategy(precision: str, gpu: bool) -> Any:
    """``"ddp"``, or on a GPU under bf16-mixed a DDP strategy that all-reduces bf16 gradients."""
    if not (gpu and precision == "bf16-mixed"):
        return "ddp"
    from pytorch_lightning.strategies import DDPStrategy
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return DDPStrategy(ddp_comm_hook=default_hooks.bf16_compress_hook)
