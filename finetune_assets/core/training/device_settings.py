"""What the trainer sets differently on a GPU, in one place (a CPU run keeps the config as given).

:func:`resolve` runs once at the start of ``run.train`` (beside ``precision: auto``) and returns the
config with every device-dependent value filled in, so the data module, the LR schedule's step
count, MLflow's parameters and ``metrics.json`` all see the values that ran; what it chose and why
is the run's ``device_settings`` record.

On a GPU:

- **batch** (``gpu_batch_tokens``): the per-device batch is ``max(batch_size, tokens //
  max_length)``. Null sizes the token budget from the GPU's memory and the encoder's shape
  (:func:`auto_batch_tokens`): half the memory left after the weights, gradients and AdamW state
  (16 bytes a parameter) for activations, at :data:`ACTIVATION_BYTES_PER_TOKEN_LAYER` x hidden size
  bytes per token and layer, rounded down to a power of two and capped at :data:`MAX_BATCH_TOKENS`
  (past that a base-size encoder's matrix products are large already; a bigger batch only grows
  the global batch). BERT-base (12 x 768, 110M parameters): 80 GB H100 -> 65,536 tokens (batch 128
  at max_length 512), 141 GB H200 the same (capped), 24 GB L4 -> 16,384 (32). The budget assumes
  every sequence is ``max_length`` long, so it never runs out of memory on long reviews; short
  ones fill less of it (padding is per batch).
- ``eval_batch_size`` unset: 4 x the (resolved) training batch; evaluation keeps no activations
  for a backward pass, so a bigger batch fits and keeps the device busy. CPU: the training batch.
- ``num_workers`` unset: the CPUs this process may use, shared by the node's ranks, one left for
  the training loop itself, at most :data:`MAX_WORKERS` (llm-foundry's default); on CPU 0: the
  workers would compete with training for the same cores (the README's command runs in-process).
- AdamW ``fused=True`` on CUDA under DDP: one kernel for the whole update, not a loop of small
  ones.
- DDP under ``bf16-mixed`` on CUDA: gradients all-reduced in bf16 (torch's ``bf16_compress_hook``),
  half the bytes on the wire; the optimizer still sees fp32 gradients.
- Pinned host memory for the loaders on CUDA (``run.train``).

On every device: ``attn_implementation`` (SDPA where the model class supports it: the choice and
any fallback's reason come from :func:`load_with_attention`) and the opt-in ``compile``
(:func:`compile_blocks`).

Measured by ``benchmarks/gpu/`` when a GPU is lent.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
from pytorch_lightning.strategies import DDPStrategy

from finetune_assets.core.training.data.sharding import encoder_layer_class

log = logging.getLogger("finetune_assets.core.training")

EVAL_BATCH_FACTOR_GPU = 4
# Activation bytes kept per token and encoder layer, per unit of hidden size, for the backward pass
# under bf16 autocast: Megatron-LM's 34 (Korthikanti et al. 2022, "Reducing Activation
# Recomputation", without the attention-score term that SDPA does not store) plus fp32 copies
# (layer-norm and loss inputs under autocast) and allocator slack.
ACTIVATION_BYTES_PER_TOKEN_LAYER = 48
BYTES_PER_PARAMETER = 16  # fp32 weights, gradients, AdamW's two moments
MAX_BATCH_TOKENS = 65_536
MIN_BATCH_TOKENS = 2_048
MAX_WORKERS = 8


def on_gpu(accelerator: str) -> bool:
    return accelerator != "cpu" and torch.cuda.is_available()


@dataclass(frozen=True)
class EncoderShape:
    """What sizes the activations: read from the model folder's ``config.json`` (no weights)."""

    hidden_size: int
    layers: int
    parameters: int

    @classmethod
    def of(cls, model_dir: str) -> EncoderShape:
        from transformers import AutoConfig  # lazy: only sizing a GPU batch reads the config

        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        hidden = int(config.hidden_size)  # attribute_map: DistilBERT's dim, ...
        layers = int(config.num_hidden_layers)
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        # an encoder block: 4 h^2 (attention) + 8 h^2 (feed-forward at 4 h); plus the embeddings
        return cls(hidden, layers, 12 * layers * hidden * hidden + vocab * hidden)


def auto_batch_tokens(device_memory_bytes: int, shape: EncoderShape) -> int:
    """Padded tokens per device and step that fit the device (see the module docstring)."""
    free = device_memory_bytes - BYTES_PER_PARAMETER * shape.parameters
    per_token = ACTIVATION_BYTES_PER_TOKEN_LAYER * shape.hidden_size * shape.layers
    fits = max(0, free) // 2 // per_token
    tokens = 1 << max(0, int(fits).bit_length() - 1) if fits else 0
    return max(MIN_BATCH_TOKENS, min(MAX_BATCH_TOKENS, tokens))


def gpu_batch_size(batch_size: int, max_length: int, tokens: int) -> int:
    return max(batch_size, tokens // max_length)


def eval_batch_size(batch_size: int, eval_batch_size: int | None, gpu: bool) -> int:
    if eval_batch_size is not None:
        return eval_batch_size
    return batch_size * EVAL_BATCH_FACTOR_GPU if gpu else batch_size


def usable_cpus() -> int:
    """CPUs this process may run on (a container's cpuset / affinity, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_workers(gpu: bool, cpus: int, local_world: int) -> int:
    if not gpu:
        return 0
    return max(0, min(MAX_WORKERS, cpus // max(1, local_world) - 1))


@dataclass(frozen=True)
class DeviceSettings:
    """What :func:`resolve` chose (``metrics.json``'s ``device_settings``); ``None``: not chosen
    here.
    """

    device: str
    batch_size: int
    eval_batch_size: int
    num_workers: int
    batch_tokens: int | None = None  # the GPU token budget the batch came from
    batch_from: str = "batch_size"  # batch_size | gpu_batch_tokens | auto (memory x encoder)
    device_memory_gib: float | None = None
    cpus: int | None = None
    attn_implementation: str | None = None  # what the loaded model uses (set after loading)
    attn_fallback: str | None = None  # why it is not the one asked for
    compiled_blocks: int = 0

    def record(self) -> dict[str, Any]:
        return asdict(self)


def resolve(
    config: Any,
    gpu: bool,
    local_world: int = 1,
    shape: EncoderShape | None = None,
    device_memory: int | None = None,
    cpus: int | None = None,
) -> tuple[Any, DeviceSettings]:
    """The config with batch, eval batch and loader workers for this device; and the record.

    ``shape`` and ``device_memory`` are read here when not given (tests pass an H100's numbers).
    """
    cpus = usable_cpus() if cpus is None else cpus
    batch, tokens, source, memory = config.batch_size, None, "batch_size", None
    if gpu and config.gpu_batch_tokens != 0:
        if config.gpu_batch_tokens is None:
            if device_memory is None:
                index = int(os.environ.get("LOCAL_RANK", 0)) % max(1, torch.cuda.device_count())
                device_memory = torch.cuda.get_device_properties(index).total_memory
            shape = shape or EncoderShape.of(config.model_dir)
            tokens, source = auto_batch_tokens(device_memory, shape), "auto"
            memory = round(device_memory / 2**30, 1)
        else:
            tokens, source = config.gpu_batch_tokens, "gpu_batch_tokens"
        batch = gpu_batch_size(config.batch_size, config.max_length, tokens)
        if batch == config.batch_size:
            source = "batch_size"
    workers = config.num_workers
    if workers is None:
        workers = default_workers(gpu, cpus, local_world)
    evaluation = eval_batch_size(batch, config.eval_batch_size, gpu)
    settings = DeviceSettings(
        device="cuda" if gpu else "cpu",
        batch_size=batch,
        eval_batch_size=evaluation,
        num_workers=workers,
        batch_tokens=tokens,
        batch_from=source,
        device_memory_gib=memory,
        cpus=cpus,
    )
    resolved = config.model_copy(
        update={"batch_size": batch, "eval_batch_size": evaluation, "num_workers": workers}
    )
    return resolved, settings


def adamw_options(device: torch.device, clips_under_amp: bool = False) -> dict[str, Any]:
    """``fused`` AdamW on CUDA, except where Lightning's mixed-precision plugin clips gradients:
    it refuses to clip for an optimizer that unscales inside its step (fused AdamW), so DDP on a
    GPU with the default ``gradient_clip_val`` failed at its first step (first GPU check,
    2026-12-04).
    """
    return {"fused": True} if device.type == "cuda" and not clips_under_amp else {}


def ddp_strategy(precision: str, gpu: bool) -> Any:
    """``"ddp"``, or on a GPU under bf16-mixed a DDP strategy that all-reduces bf16 gradients."""
    if not (gpu and precision == "bf16-mixed"):
        return "ddp"
    # lazy: only DDP under bf16 on GPUs compresses its gradients
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return DDPStrategy(ddp_comm_hook=default_hooks.bf16_compress_hook)


# -- attention and compile ------------------------------------------------------------------------


def load_with_attention(load: Any, requested: str) -> tuple[Any, str, str | None]:
    """``load(attn_implementation)`` with the asked-for kernels, falling back to eager where the
    model class refuses SDPA; (model, what it uses, why not the one asked for).

    transformers itself judges support (its error names the class): no list kept here.
    """
    want = "sdpa" if requested == "auto" else requested
    try:
        model = load(want)
    except (ValueError, ImportError) as err:
        if want == "eager":
            raise
        model = load("eager")  # any other problem fails here too, as without the request
        reason = f"{type(model).__name__}: {str(err).splitlines()[0]}"
        log.warning("attention: eager, not %s (%s)", requested, reason)
        return model, _attention_of(model), reason
    return model, _attention_of(model), None


def _attention_of(model: Any) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def compile_blocks(model: torch.nn.Module) -> int:
    """``torch.compile`` each encoder block in place (``nn.Module.compile``); the count compiled.

    Per block, as torchtitan does: the blocks are identical, so one compiled graph serves them all
    (a short compile), the embeddings' and the mask's Python stays eager (no graph breaks there),
    and FSDP2 shards the compiled blocks unchanged. In place, so the state dict's keys are the
    model's own (no ``_orig_mod.``): checkpoints, the export and a resume are as without compile.
    ``dynamic=True``: batches are padded per batch, so every length would otherwise recompile
    once before torch switches to dynamic shapes anyway. Already compiled blocks are left as they
    are (Lightning calls ``configure_model`` before each stage).
    """
    block = encoder_layer_class(model)
    count = 0
    for module in model.modules():
        if isinstance(module, block):
            if getattr(module, "_compiled_call_impl", None) is None:
                module.compile(dynamic=True)
            count += 1
    return count
