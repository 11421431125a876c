"""The trainer's whole input, written once as pydantic models.

:class:`~.hyperparameters.HyperParameters` (:mod:`.hyperparameters`) is what a person tunes;
``TrainerConfig`` adds what one run is wired to (paths, shard URLs, labels, MLflow, a tuning
trial). The asset writes it as JSON; every torchrun worker validates the same model when it reads
it, so a typo fails fast with the key's path instead of being ignored. No Dagster here: this runs
inside pods.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import fsspec
from pydantic import Field, ValidationError, field_validator, model_validator

from finetune_assets.core.labels.infer import LABELS
from finetune_assets.core.training.hyperparameters import HyperParameters, StrictModel

# What best-model selection and early stopping watch (logged by every validation).
SELECTION_METRIC = "val/macro_f1"


class ConfigError(ValueError):
    """A trainer config that cannot be used; the message names the offending key."""


class DataConfig(StrictModel):
    """The three MDS splits and how they are streamed (wiring, not tuning: not in the launchpad)."""

    train_url: str = Field(min_length=1)
    validation_url: str = Field(min_length=1)
    test_url: str = Field(min_length=1)
    # Where the splits are copied (and decompressed) for reading, one sub-folder per split; the
    # published shards are never read in place. None: a per-run folder under the temp dir, removed
    # after a successful run. A folder given here is kept (e.g. a persistent volume).
    local_cache_dir: str | None = None
    # batches (windows) each worker reads ahead, with num_workers > 0
    prefetch_factor: int = Field(2, ge=1)
    shuffle_seed: int = 9176
    # Length buckets run in one order on every rank (each step, all ranks the same length rank);
    # "per_rank" (each rank its own order: ranks wait for the longest) only for comparison in
    # benchmarks/.
    bucket_order: Literal["shared", "per_rank"] = "shared"
    download_retry: int = Field(2, ge=0)
    # None: the run's node count, so each node streams and caches only its share of the shards.
    # Saved in every checkpoint's loader state and restored on resume (a world-size change is
    # refused).
    num_canonical_nodes: int | None = Field(None, ge=1)
    predownload: int | None = None
    # Samples per label id in the train split (mds_shards' train/split_stats.json, carried here by
    # finetuned_model): class_weights "balanced" needs them; the trainer never counts the shards.
    train_label_counts: list[int] | None = None

    @field_validator("local_cache_dir")
    @classmethod
    def _local(cls, value: str | None) -> str | None:
        if value and "://" in value and not value.startswith("file://"):
            raise ValueError(f"must be a local folder, got {value!r}")
        return value


class MlflowConfig(StrictModel):
    """Where rank 0 records the run. Empty ``tracking_uri`` means ``MLFLOW_TRACKING_URI`` or
    mlflow's default.
    """

    tracking_uri: str | None = None
    experiment_name: str = Field("review-classifier", min_length=1)
    artifact_location: str | None = None  # used only when the experiment is created
    registered_model_name: str | None = "review-classifier"
    run_name: str | None = None
    # dataset_version, shard_data_version, code_version...
    tags: dict[str, str] = Field(default_factory=dict)
    log_model: bool = True
    # Rank 0's logging + registration after training; past it the run fails (a re-run resumes at the
    # end).
    timeout_seconds: float = Field(900.0, gt=0)

    @field_validator("tags")
    @classmethod
    def _no_secrets(cls, tags: dict[str, str]) -> dict[str, str]:
        for key in tags:
            if any(s in key.lower() for s in ("token", "secret", "password", "key")):
                raise ValueError(f"tag {key!r} looks like a secret; secrets are never logged")
        return tags


class PrunerConfig(StrictModel):
    """The study's pruner: Optuna keeps it on the Study, not in storage; rebuilt by the trainer."""

    kind: Literal["median", "none"] = "median"
    startup_trials: int = Field(2, ge=0)  # finished trials before any pruning
    warmup_steps: int = Field(0, ge=0)  # reports numbered below this never prune a trial


class TrialConfig(StrictModel):
    """One Optuna trial this run is: the trainer reports to the study through its durable storage.

    ``storage`` is what both sides open (core/training/trial/pruning.py ``open_storage``): an
    SQLAlchemy URL
    (``postgresql://…``, ``sqlite:///…``) or the path of a journal file every worker can reach.
    """

    storage: str = Field(min_length=1)
    study_name: str = Field(min_length=1)
    trial_id: int = Field(ge=0)  # the storage's id, not the trial number: Trial(study, trial_id)
    metric: str = "val/macro_f1"  # maximized; reported at each validation
    reports: int = Field(4, ge=1, description="validations (pruning decisions) over the run")
    pruner: PrunerConfig = Field(default_factory=PrunerConfig)


class TrainerConfig(HyperParameters):
    """One training run: the hyper-parameters plus inputs, outputs and tracking."""

    model_dir: str = Field(min_length=1)  # HF folder of the pretrained model (weights + tokenizer)
    output_dir: str = Field(min_length=1)  # rank 0 writes model/ and metrics.json here
    # stable across restarts of the same inputs: resume reads last.ckpt
    checkpoint_dir: str = Field(min_length=1)
    data: DataConfig
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    # The dataset version's classes in label-id order (the shards' labels are ids into this list);
    # they become the model's num_labels / id2label / label2id. Default: Positive, Negative, Mixed.
    labels: list[str] = Field(default_factory=lambda: list(LABELS))
    trial: TrialConfig | None = None  # set when this run is a trial of a tuning study

    @model_validator(mode="after")
    def _sharded_on_a_filesystem(self) -> TrainerConfig:
        url = self.checkpoint_dir
        if self.checkpoint_format == "sharded" and "://" in url and not url.startswith("file://"):
            raise ValueError(
                f"checkpoint_format 'sharded' writes a folder every rank writes into: "
                f"checkpoint_dir must be a filesystem path (a volume every node mounts), got "
                f"{url!r}; use checkpoint_format 'full' with an object store"
            )
        return self

    @field_validator("labels")
    @classmethod
    def _distinct(cls, labels: list[str]) -> list[str]:
        if len(labels) < 2 or len({n.casefold() for n in labels}) != len(labels):
            raise ValueError(f"must be at least two distinct class names, got {labels}")
        return labels

    def train_label_counts(self) -> list[int]:
        """The train split's samples per label id that class_weights 'balanced' needs (checked
        here, not counted).
        """
        counts = self.data.train_label_counts
        if counts is None or len(counts) != len(self.labels) or min(counts) < 0:
            raise ConfigError(
                f"class_weights 'balanced' needs data.train_label_counts with one count per label "
                f"({len(self.labels)}), got {counts}: finetuned_model fills it from mds_shards' "
                "train/split_stats.json (or set class_weights 'none')"
            )
        return list(counts)

    # -- (de)serialisation -------------------------------------------------------------------

    @classmethod
    def from_dict(cls, obj: Any) -> TrainerConfig:
        try:
            return cls.model_validate(obj)
        except ValidationError as err:
            raise ConfigError(explain(err)) from None

    @classmethod
    def from_json(cls, path_or_url: str) -> TrainerConfig:
        """Read a config from a local path or any fsspec URL (``s3://…``, ``file://…``)."""
        with fsspec.open(path_or_url, "r") as f:
            try:
                obj = json.load(f)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path_or_url}: not valid JSON: {err}") from err
        try:
            return cls.from_dict(obj)
        except ConfigError as err:
            raise ConfigError(f"{path_or_url}: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def hparams(self) -> dict[str, Any]:
        """Flat, secret-free parameters for MLflow (paths and tracking left out)."""
        # data, not a knob
        data = self.data.model_dump(
            exclude={
                "train_url",
                "validation_url",
                "test_url",
                "local_cache_dir",
                "train_label_counts",
            }
        )
        return {
            **self.hyper_parameters(),
            "labels": list(self.labels),
            **{f"data.{k}": v for k, v in data.items()},
        }


def explain(err: ValidationError) -> str:
    """One line per problem, each naming the key's dotted path (``unknown key
    'data.batchsize'``).
    """
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown key {where!r}")
        elif e["type"] == "missing":
            lines.append(f"missing required key {where!r}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{where}: {msg} (got {e['input']!r})" if where != "config" else msg)
    return "; ".join(lines)
