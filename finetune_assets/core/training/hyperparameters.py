"""What a person tunes per run: :class:`HyperParameters`, every field, bound, choice and default
written once.

The ``finetuned_model`` launchpad config *is* this model (``FinetuneConfig(dg.Config,
HyperParameters)``), and :class:`~.config.TrainerConfig` extends it with what one run is wired to.
No Dagster here: this runs inside pods.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Optimizer = Literal["adamw", "adadelta"]
# "auto": bf16-mixed where the CPU (AVX512-BF16 / AMX) or GPU supports bf16, else 32
# (core/training/precision.py).
Precision = Literal["auto", "32", "32-true", "bf16-mixed", "16-mixed"]
Strategy = Literal["ddp", "fsdp", "auto"]
Accelerator = Literal["auto", "cpu", "gpu"]
ClassWeights = Literal["balanced", "none"]
SelectModel = Literal["best", "last"]
LrSchedule = Literal["linear", "cosine", "constant"]


class StrictModel(BaseModel):
    """Unknown keys are errors; no silent str -> int coercion (``"2"`` is not an epoch count)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class HyperParameters(StrictModel):
    """What a person may change per run (the launchpad shows exactly these fields, with these
    defaults).

    AdamW lr 5e-5 with 10% linear warmup then linear decay is the usual recipe for fine-tuning a
    pretrained BERT: two epochs, validated after each, the best validation macro-F1's weights
    exported (``benchmarks/recipe_study.py``: one epoch underfits, more cost time the README's
    first command does not have on 2 CPU cores). The Adadelta recipe stays one setting away:
    ``optimizer="adadelta", lr=1.0, warmup_ratio=0`` (StepLR ``gamma`` per epoch); why it is not
    the default: benchmarks/README.md, "Training".
    """

    epochs: int = Field(
        2,
        ge=1,
        description="passes over the training split; the best validation's weights are kept "
        "(select_model). One was too few on the default set (benchmarks/README.md, 'Recipe "
        "study')",
    )
    max_steps: int = Field(
        -1, ge=-1, description="-1: all epochs; else stop after this many optimizer steps"
    )
    batch_size: int = Field(8, ge=1, description="per device (per torchrun worker)")
    eval_batch_size: int | None = Field(
        None,
        ge=1,
        description="validation/test batch per device; null: batch_size on CPU, 4 x on a GPU "
        "(core/training/device_settings.py)",
    )
    optimizer: Optimizer = Field(
        "adamw",
        description="adamw (linear warmup/decay) or adadelta (the original notebook's recipe: "
        "lr 1.0, warmup_ratio 0, StepLR gamma per epoch)",
    )
    lr: float = Field(5e-5, gt=0, description="5e-5 for adamw; the seed used 1.0 with adadelta")
    gamma: float = Field(0.7, gt=0, le=1, description="StepLR decay per epoch (adadelta)")
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(
        0.1, ge=0, lt=1, description="fraction of steps with linear warmup (adamw)"
    )
    lr_schedule: LrSchedule = Field(
        "linear",
        description="after the warmup (adamw): linear or cosine decay to 0, or constant",
    )
    precision: Precision = Field(
        "auto",
        description="auto: bf16-mixed where the CPU or GPU supports bf16, else 32 "
        "(the run records what it used); 32, bf16-mixed, 16-mixed (GPU)",
    )
    export_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="dtype of the exported model's weights; training always keeps fp32 master "
        "weights (bf16-mixed is autocast), whatever the pretrained checkpoint's dtype",
    )
    accumulate_grad_batches: int = Field(1, ge=1)
    gpu_batch_tokens: int | None = Field(
        None,
        ge=0,
        description="on a GPU, padded tokens per device and step: the batch there is "
        "max(batch_size, gpu_batch_tokens // max_length); null: sized from the GPU's memory and "
        "the encoder's size (core/training/device_settings.py: BERT-base at max_length 512 on an "
        "80 GB "
        "H100 gets 128); 0: batch_size on a GPU too. CPU runs always use batch_size",
    )
    compile: bool = Field(
        False,
        description="torch.compile each encoder block (inductor; dynamic shapes, since batches "
        "are padded per batch): faster steps on a GPU after a compile of a minute or more",
    )
    attn_implementation: Literal["auto", "sdpa", "eager"] = Field(
        "auto",
        description="attention kernels: auto and sdpa use torch's scaled_dot_product_attention "
        "where the model class supports it, else eager (the run records which, and why)",
    )
    checkpoint_format: Literal["full", "sharded"] = Field(
        "full",
        description="full: last.ckpt is one file (rank 0 writes the gathered state); sharded "
        "(strategy fsdp only): a torch.distributed.checkpoint folder each rank writes its shards "
        "into, for models whose full state does not fit one host; it resumes at another world "
        "size from an epoch's end",
    )
    nonfinite_loss: Literal["stop", "skip"] = Field(
        "stop",
        description="a NaN/inf training loss: stop the run naming the step and batch (checked at "
        "the log interval, no per-step sync); skip: drop that optimizer step, counted (one host "
        "sync per micro-batch)",
    )
    gradient_clip_val: float | None = Field(
        None, gt=0, description="clip gradients to this norm (null: off)"
    )
    strategy: Strategy = Field(
        "ddp",
        description="ddp; fsdp (FSDP2: each encoder block sharded over a node's "
        "ranks, replicated across nodes); auto: fsdp above 1B "
        "parameters on more than one process, else ddp",
    )
    accelerator: Accelerator = Field("auto", description="auto, cpu or gpu")
    seed: int = 42
    class_weights: ClassWeights = Field(
        "balanced",
        description="balanced: loss weights n / (classes * count) from "
        "the train split's label counts (rare classes count, macro-F1); or none",
    )
    num_workers: int | None = Field(
        None,
        ge=0,
        description="data loader workers per device; null: 0 (in-process) on CPU, on a GPU from "
        "the CPUs each local rank has (core/training/device_settings.py)",
    )
    shuffle: bool = True
    max_length: int = Field(
        512, ge=2, le=8192, description="longer token sequences are cut (keeping [SEP])"
    )
    # 16: the fastest setting measured (benchmarks/README.md, "Fast defaults")
    bucket_batches: int = Field(
        16,
        ge=1,
        description="length bucketing: sort windows of this many batches by "
        "length before batching (less padding); 1: off",
    )
    checkpoint_every_n_steps: int | None = Field(
        500,
        ge=1,
        description="checkpoint every this many optimizer steps (always right after a step, never "
        "inside gradient accumulation); on a GPU the file is written in the background",
    )
    checkpoint_every_minutes: float | None = Field(
        None,
        gt=0,
        description="instead of steps: a wall-clock interval, read by rank 0 at the log interval "
        "and broadcast (a time check every batch would sync the host each step)",
    )
    select_model: SelectModel = Field(
        "best",
        description="best: export (and test) the weights of the best validation macro-F1; "
        "last: the weights training ended with",
    )
    early_stopping_patience: int | None = Field(
        2,
        ge=1,
        description="stop after this many validations without a better validation macro-F1 "
        "(null: train every epoch)",
    )
    val_check_every_n_steps: int | None = Field(
        None,
        ge=1,
        description="validate every this many optimizer steps (large versions); null: at "
        "each epoch end",
    )
    log_every_n_steps: int = Field(10, ge=1)
    progress_every_seconds: float = Field(
        30.0,
        ge=1,
        description="rank 0's progress line (Dagster log + MLflow): a steady pace on any hardware",
    )
    limit_train_batches: int | None = Field(
        None, ge=1, description="cap batches per epoch (smoke runs)"
    )
    limit_val_batches: int | None = Field(None, ge=1)
    limit_test_batches: int | None = Field(None, ge=1)

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_number(cls, value: Any) -> Any:
        # 32 == "32"
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="before")
    @classmethod
    def _one_checkpoint_trigger(cls, data: Any) -> Any:
        """A time interval replaces the default step interval; both given is a contradiction."""
        if isinstance(data, dict) and data.get("checkpoint_every_minutes") is not None:
            if data.get("checkpoint_every_n_steps") is not None:
                raise ValueError(
                    "set checkpoint_every_n_steps or checkpoint_every_minutes, not both"
                )
            data = {**data, "checkpoint_every_n_steps": None}
        return data

    @model_validator(mode="after")
    def _gpu_only_precision(self) -> HyperParameters:
        if self.accelerator == "cpu" and self.precision == "16-mixed":
            raise ValueError(
                "precision '16-mixed' needs a GPU; use 'auto', '32' or 'bf16-mixed' on CPU"
            )
        if self.checkpoint_format == "sharded" and self.strategy == "ddp":
            raise ValueError(
                "checkpoint_format 'sharded' needs strategy 'fsdp' (or 'auto', which shards large "
                "models): a DDP replica's state is whole on every rank; use 'full'"
            )
        # Lightning's ModelParallelStrategy
        if self.strategy == "fsdp" and self.precision == "16-mixed":
            raise ValueError(
                "precision '16-mixed' is not supported with strategy 'fsdp'; use 'bf16-mixed' or "
                "'32'"
            )
        return self

    def hyper_parameters(self) -> dict[str, Any]:
        """Only this model's fields (a subclass such as the Dagster config may carry more)."""
        return {name: getattr(self, name) for name in HyperParameters.model_fields}
