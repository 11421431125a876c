"""The trainer's whole input as one typed, validated file.

The ``finetuned_model`` asset (or a person) writes it as JSON; every torchrun worker reads it with
``TrainerConfig.from_json(path_or_url)``. Unknown keys are errors, not silently ignored typos.
No Dagster here: this runs inside pods.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import fsspec

from finetune_assets.data.labels import LABELS

Optimizer = Literal["adadelta", "adamw"]
Precision = Literal["32", "32-true", "bf16-mixed", "16-mixed"]
Strategy = Literal["ddp", "fsdp", "auto"]
Accelerator = Literal["auto", "cpu", "gpu"]
ClassWeights = Literal["none", "balanced"]


class ConfigError(ValueError):
    """A trainer config that cannot be used; the message names the offending key."""


@dataclass
class DataConfig:
    """The three MDS splits and how they are streamed."""

    train_url: str
    validation_url: str
    test_url: str
    # Where the splits are copied (and decompressed) for reading, one sub-folder per split; the
    # published shards are never read in place. None: a per-run folder under the temp dir, removed
    # after a successful run. A folder given here is kept (e.g. a persistent volume).
    local_cache_dir: str | None = None
    batch_size: int = 8  # per device; StreamingDataset and DataLoader get the same value
    num_workers: int = 0  # reviews are short: the loader runs >100x faster than a CPU step in-process
    prefetch_factor: int = 2  # batches (windows) each worker reads ahead, with num_workers > 0
    shuffle: bool = True
    shuffle_seed: int = 9176
    download_retry: int = 2
    # None: the run's node count, so each node streams and caches only its share of the shards. Saved
    # in every checkpoint's loader state and restored on resume (a world-size change is refused).
    num_canonical_nodes: int | None = None
    max_length: int = 512
    predownload: int | None = None
    # Length bucketing: sort windows of this many batches by length before batching (1: off).
    bucket_batches: int = 1
    # Samples per label id in the train split (mds_shards' train/split_stats.json, carried here by
    # finetuned_model): class_weights "balanced" needs them; the trainer never counts the shards.
    train_label_counts: list[int] | None = None

    def __post_init__(self) -> None:
        for name in ("train_url", "validation_url", "test_url"):
            if not getattr(self, name):
                raise ConfigError(f"data.{name} must be a non-empty path or URL")
        if self.local_cache_dir and "://" in self.local_cache_dir and not self.local_cache_dir.startswith("file://"):
            raise ConfigError(f"data.local_cache_dir must be a local folder, got {self.local_cache_dir!r}")
        _positive("data.batch_size", self.batch_size)
        if self.num_canonical_nodes is not None:
            _positive("data.num_canonical_nodes", self.num_canonical_nodes)
        _positive("data.prefetch_factor", self.prefetch_factor)
        _positive("data.bucket_batches", self.bucket_batches)
        _non_negative("data.num_workers", self.num_workers)
        _non_negative("data.download_retry", self.download_retry)
        if not 2 <= self.max_length <= 8192:
            raise ConfigError(f"data.max_length must be in [2, 8192], got {self.max_length}")


@dataclass
class OptimConfig:
    """AdamW lr 5e-5, 10% linear warmup then linear decay: the usual recipe for fine-tuning a pretrained BERT.

    The seed's recipe stays one setting away: ``name="adadelta", lr=1.0`` (StepLR ``gamma`` 0.7 per
    epoch). On the offline sample (benchmarks/README.md, "Training") it reached test macro-F1 0.44
    (Mixed never predicted) where AdamW 5e-5 reached 1.00 in the same 2 epochs and the same time.
    """

    name: Optimizer = "adamw"
    lr: float = 5e-5
    gamma: float = 0.7  # StepLR decay per epoch (adadelta)
    weight_decay: float = 0.0
    warmup_ratio: float = 0.1  # fraction of total steps for linear warmup, then linear decay (adamw)

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.lr}")
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"optim.gamma must be in (0, 1], got {self.gamma}")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"optim.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")


@dataclass
class MlflowConfig:
    """Where rank 0 records the run. Empty ``tracking_uri`` means ``MLFLOW_TRACKING_URI`` or mlflow's default."""

    tracking_uri: str | None = None
    experiment_name: str = "review-classifier"
    artifact_location: str | None = None  # used only when the experiment is created
    registered_model_name: str | None = "review-classifier"
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # dataset_version, shard_data_version, code_version...
    log_model: bool = True
    # Rank 0's logging + registration after training; past it the run fails (a re-run resumes at the end).
    timeout_seconds: float = 900.0

    def __post_init__(self) -> None:
        if not self.experiment_name:
            raise ConfigError("mlflow.experiment_name must not be empty")
        if not self.timeout_seconds > 0:
            raise ConfigError(f"mlflow.timeout_seconds must be > 0, got {self.timeout_seconds}")
        for key in self.tags:
            if any(s in key.lower() for s in ("token", "secret", "password", "key")):
                raise ConfigError(f"mlflow.tags[{key!r}] looks like a secret; secrets are never logged")


@dataclass
class TrainerConfig:
    """One training run: inputs, outputs, hyper-parameters and tracking."""

    model_dir: str  # HF folder of the pretrained model (weights + tokenizer)
    output_dir: str  # rank 0 writes model/ and metrics.json here
    checkpoint_dir: str  # stable across restarts of the same inputs: resume reads last.ckpt here
    data: DataConfig
    optim: OptimConfig = field(default_factory=OptimConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    epochs: int = 2
    max_steps: int = -1  # -1: run all epochs
    precision: Precision = "32"
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    strategy: Strategy = "ddp"
    accelerator: Accelerator = "auto"
    seed: int = 42
    # "balanced": cross-entropy weights n / (classes * count) from the train split's label counts, so
    # a rare class (Mixed, Negative on real reviews: 81% are Positive) is not ignored for the majority
    # (macro-F1 is the metric that promotes models). "none": plain cross-entropy.
    class_weights: ClassWeights = "balanced"
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 200
    progress_every_seconds: float = 30.0  # rank 0's progress line (log + MLflow): a steady pace on any hardware
    # The dataset version's classes in label-id order (the shards' labels are ids into this list);
    # they become the model's num_labels / id2label / label2id. Default: the seed's three classes.
    labels: list[str] = field(default_factory=lambda: list(LABELS))
    # Test aids: cap the batches per epoch / per evaluation (None: all).
    limit_train_batches: int | None = None
    limit_val_batches: int | None = None
    limit_test_batches: int | None = None

    def __post_init__(self) -> None:
        for name in ("model_dir", "output_dir", "checkpoint_dir"):
            if not getattr(self, name):
                raise ConfigError(f"{name} must be a non-empty path or URL")
        _positive("epochs", self.epochs)
        if self.max_steps != -1 and self.max_steps < 1:
            raise ConfigError(f"max_steps must be -1 or >= 1, got {self.max_steps}")
        _positive("accumulate_grad_batches", self.accumulate_grad_batches)
        if self.gradient_clip_val is not None and self.gradient_clip_val <= 0:
            raise ConfigError(f"gradient_clip_val must be > 0 or null, got {self.gradient_clip_val}")
        _positive("log_every_n_steps", self.log_every_n_steps)
        _positive("progress_every_seconds", self.progress_every_seconds)
        _positive("checkpoint_every_n_steps", self.checkpoint_every_n_steps)
        for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if len(self.labels) < 2 or len({n.casefold() for n in self.labels}) != len(self.labels):
            raise ConfigError(f"labels must be at least two distinct class names, got {self.labels}")
        if self.accelerator == "cpu" and self.precision == "16-mixed":
            raise ConfigError("precision '16-mixed' needs a GPU; use '32' or 'bf16-mixed' on CPU")

    def train_label_counts(self) -> list[int]:
        """The train split's samples per label id that class_weights 'balanced' needs (checked here, not counted)."""
        counts = self.data.train_label_counts
        if counts is None or len(counts) != len(self.labels) or min(counts) < 0:
            raise ConfigError(f"class_weights 'balanced' needs data.train_label_counts with one count per label "
                              f"({len(self.labels)}), got {counts}: finetuned_model fills it from mds_shards' "
                              "train/split_stats.json (or set class_weights 'none')")
        return list(counts)

    # -- (de)serialisation -------------------------------------------------------------------

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> TrainerConfig:
        return _build(cls, obj, "")

    @classmethod
    def from_json(cls, path_or_url: str) -> TrainerConfig:
        """Read a config from a local path or any fsspec URL (``s3://…``, ``file://…``)."""
        with fsspec.open(path_or_url, "r") as f:
            try:
                obj = json.load(f)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path_or_url}: not valid JSON: {err}") from err
        return cls.from_dict(obj)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def hparams(self) -> dict[str, Any]:
        """Flat, secret-free hyper-parameters for MLflow params (paths and tracking left out)."""
        flat: dict[str, Any] = {}
        for key, value in self.to_dict().items():
            if key in ("mlflow", "model_dir", "output_dir", "checkpoint_dir"):
                continue
            if isinstance(value, dict):
                for sub, v in value.items():
                    if not sub.endswith(("_url", "_dir")) and sub != "train_label_counts":  # data, not a knob
                        flat[f"{key}.{sub}"] = v
            else:
                flat[key] = value
        return flat


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {value}")


def _non_negative(name: str, value: int) -> None:
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value}")


def _build(cls: type, obj: Any, where: str) -> Any:
    """Build dataclass ``cls`` from a dict, rejecting unknown keys and wrongly typed values."""
    label = where or "config"
    if not isinstance(obj, dict):
        raise ConfigError(f"{label}: expected an object, got {type(obj).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown key {_path(where, unknown[0])!r} (known keys of {label}: {', '.join(sorted(fields))})"
        )
    missing = [
        name for name, f in fields.items()
        if name not in obj and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required key {_path(where, missing[0])!r}")
    kwargs = {name: _coerce(hints[name], value, _path(where, name)) for name, value in obj.items()}
    return cls(**kwargs)


def _path(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{where}: must not be null")
    if origin is Literal:
        if isinstance(value, int) and not isinstance(value, bool) and str(value) in args:
            value = str(value)  # precision: 32 and "32" mean the same
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ConfigError(f"{where}: expected an object of strings to strings")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported type {tp}")  # pragma: no cover - a bug in this module
