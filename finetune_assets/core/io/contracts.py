"""What the assets publish, in one place: asset names, file names, splits, schemas, typed readers.

Every producer writes with these names and every consumer (downstream assets, checks, the CLI, the
trainer in a pod) reads through these readers, so a renamed file or column is one edit here. Kept
free of Dagster: the trainer and the slice workers import it too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from finetune_assets.core.io.primitives import read_json

# -- asset names (the storage layout's first folder and the Dagster asset keys) --------------------
RAW_REVIEWS = "raw_reviews"
PRETRAINED_MODEL = "pretrained_model"
TOKENIZED_REVIEWS = "tokenized_reviews"
MDS_SHARDS = "mds_shards"
FINETUNED_MODEL = "finetuned_model"
BASELINE_MODEL = "baseline_model"
CHAMPION_MODEL = "champion_model"
BENCHMARK_SCORES = "benchmark_scores"
TUNING_STUDY = "tuning_study"
# Per dataset version, in flow order (what `versions status` shows).
PARTITIONED_ASSETS = (RAW_REVIEWS, TOKENIZED_REVIEWS, MDS_SHARDS, FINETUNED_MODEL)

# -- splits ----------------------------------------------------------------------------------------
TRAIN, VALIDATION, TEST = "train", "validation", "test"
SPLITS = (TRAIN, VALIDATION, TEST)

# -- file names inside a published attempt ---------------------------------------------------------
REVIEWS_FILE = "reviews.parquet"  # raw_reviews: accepted rows (ACCEPTED_SCHEMA)
REJECTED_FILE = "rejected.parquet"  # raw_reviews: quarantined rows with a reason (REJECTED_SCHEMA)
LABELS_FILE = "labels.json"  # raw_reviews, tokenized_reviews: the version's LabelSet
# tokenized_reviews: parts/{i:05d}.arrow, Arrow IPC (TOKEN_COLUMNS), one per slice, row order
TOKEN_PARTS_DIR = "parts"
TOKEN_STATS_FILE = "stats.json"  # tokenized_reviews: rows per split + token-length statistics
SPLIT_STATS_FILE = "split_stats.json"  # mds_shards/{split}/: samples and samples per label id
TOKENIZATION_FILE = (
    "tokenization.json"  # pretrained_model: Tokenization (what tokenizing needs, no transformers)
)
MODEL_SUBDIR = "model"  # finetuned_model: the Hugging Face folder
TRAINING_RESULT_FILE = (
    "metrics.json"  # finetuned_model: TrainingResult, written by the trainer's rank 0
)
TRAINER_CONFIG_FILE = "trainer_config.json"  # finetuned_model: the trainer's whole configuration
BEST_FILE = "best.json"  # tuning_study: the best trial (trial, value, params, study_name, storage)

# -- schemas ---------------------------------------------------------------------------------------
ACCEPTED_SCHEMA = pa.schema(
    [
        ("text", pa.string()),
        ("label", pa.string()),
        ("source_file", pa.string()),
        ("source_row", pa.int64()),
        # train/validation/test, a function of the normalized text (core/prep/review_text.py)
        (
            "split",
            pa.string(),
        ),
    ]
)
REJECTED_SCHEMA = pa.schema(
    [
        ("text", pa.string()),
        ("label", pa.string()),
        ("source_file", pa.string()),
        ("source_row", pa.int64()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("source_line", pa.int64()),  # physical lines of the record in its file (CSV/TSV/JSONL)
        ("source_line_end", pa.int64()),
        ("raw", pa.string()),  # a malformed record's raw text (bounded prefix): recoverable by hand
    ]
)
# tokens.arrow: input_ids list<uint8|16|32> (unpadded, smallest type for the vocabulary), length
# int32, full_length int32 (before truncation), label int8 (id in the version's label set), split
# dictionary<string>.
TOKEN_COLUMNS = ("input_ids", "length", "full_length", "label", "split")


def mds_columns(id_dtype: str) -> dict[str, str]:
    """The MDS schema of every split: unpadded token ids of numpy dtype ``id_dtype`` and the
    label id.
    """
    return {"input_ids": f"ndarray:{id_dtype}", "label": "int8"}


class ContractError(ValueError):
    """A published artifact that does not hold what its contract promises (the message names the
    file).
    """


# -- typed readers ---------------------------------------------------------------------------------
def _fs_and_path(url: str, fs=None):
    return (fs, url) if fs is not None else fsspec.core.url_to_fs(url)


def read_reviews(attempt_url: str, fs=None, columns: list[str] | None = None) -> pa.Table:
    """raw_reviews' accepted rows; refuses a file published before the ``split`` column existed."""
    fs, path = _fs_and_path(f"{attempt_url}/{REVIEWS_FILE}", fs)
    with fs.open(path, "rb") as f:
        table = pq.read_table(f, columns=columns)
    missing = [c for c in (columns or ACCEPTED_SCHEMA.names) if c not in table.column_names]
    if missing:
        raise ContractError(
            f"{attempt_url}/{REVIEWS_FILE} lacks columns {missing} (published by an older "
            "version of raw_reviews): re-materialize raw_reviews for this dataset version"
        )
    return table


def parquet_schema(url: str, fs=None) -> pa.Schema:
    """A Parquet file's schema, from its footer (no data read)."""
    fs, path = _fs_and_path(url, fs)
    with fs.open(path, "rb") as f:
        return pq.read_schema(f)


def iter_parquet_batches(url: str, fs=None, columns: list[str] | None = None):
    """One Parquet file's record batches, one row group in memory at a time: what a check reads, so
    it needs no more memory than the step that wrote the file (row groups of its batch size).

    Row group by row group, not ``ParquetFile.iter_batches``: on pyarrow 25 the latter's resident
    memory grows with the file (2.7M reviews: 360 MB against a flat 60 MB, benchmarks/
    check_memory.py).
    """
    fs, path = _fs_and_path(url, fs)
    with fs.open(path, "rb") as f:
        parquet = pq.ParquetFile(f)
        for group in range(parquet.num_row_groups):
            yield from parquet.read_row_group(group, columns=columns).to_batches()


def read_rejected(attempt_url: str, fs=None) -> pa.Table:
    fs, path = _fs_and_path(f"{attempt_url}/{REJECTED_FILE}", fs)
    with fs.open(path, "rb") as f:
        return pq.read_table(f)


def iter_token_batches(attempt_url: str, fs=None, columns: list[str] | None = None):
    """tokenized_reviews' record batches in row order (its parts in index order), one batch in
    memory at a time.
    """
    fs, path = _fs_and_path(f"{attempt_url}/{TOKEN_PARTS_DIR}", fs)
    files = sorted(fs.glob(f"{path}/*.arrow"))
    if not files:
        raise ContractError(
            f"{attempt_url}: no {TOKEN_PARTS_DIR}/*.arrow (published by an older version of "
            "tokenized_reviews): re-materialize tokenized_reviews for this dataset version"
        )
    for file in files:
        with fs.open(file, "rb") as f:
            reader = pa.ipc.open_file(f)
            for b in range(reader.num_record_batches):
                batch = reader.get_batch(b)
                yield batch.select(columns) if columns else batch


def read_tokens(attempt_url: str, fs=None, columns: list[str] | None = None) -> pa.Table:
    """The whole tokenized table (or only ``columns``); :func:`iter_token_batches` to stream it."""
    return pa.Table.from_batches(list(iter_token_batches(attempt_url, fs, columns)))


@dataclass(frozen=True)
class TokenStats:
    """tokenized_reviews' ``stats.json``: rows per split and token-length statistics."""

    splits: dict[str, int]
    lengths: dict[str, float]

    def to_json(self) -> str:
        return json.dumps({"splits": self.splits, "lengths": self.lengths})


def read_token_stats(attempt_url: str, fs=None) -> TokenStats:
    obj = read_json(f"{attempt_url}/{TOKEN_STATS_FILE}", fs)
    return TokenStats(
        splits={k: int(v) for k, v in obj["splits"].items()}, lengths=dict(obj.get("lengths") or {})
    )


@dataclass(frozen=True)
class Tokenization:
    """pretrained_model's ``tokenization.json``: the fast tokenizer as ``AutoTokenizer`` configured
    it (no truncation, no padding), its size (added tokens included) and the longest input the model
    takes.

    Written where transformers is loaded anyway, so that tokenized_reviews needs only ``tokenizers``
    (transformers' import alone is ~6 s and ~0.8 GB per step, measured).
    """

    tokenizer_json: str
    vocab_size: int
    max_input_tokens: int

    def to_json(self) -> str:
        # the tokenizer JSON kept as a string, byte for byte: its hash names the token cache's
        # namespace
        return json.dumps(
            {
                "vocab_size": self.vocab_size,
                "max_input_tokens": self.max_input_tokens,
                "tokenizer_json": self.tokenizer_json,
            },
            ensure_ascii=False,
        )


def read_tokenization(attempt_url: str, fs=None) -> Tokenization | None:
    """pretrained_model's tokenization facts; None for a model published before they were
    written.
    """
    try:
        obj = read_json(f"{attempt_url}/{TOKENIZATION_FILE}", fs)
    except FileNotFoundError:
        return None
    return Tokenization(
        tokenizer_json=obj["tokenizer_json"],
        vocab_size=int(obj["vocab_size"]),
        max_input_tokens=int(obj["max_input_tokens"]),
    )


@dataclass(frozen=True)
class SplitStats:
    """One MDS split's ``split_stats.json``: computed once by mds_shards, where the labels are at
    hand.
    """

    samples: int
    label_counts: dict[int, int]  # label id -> samples

    def to_json(self) -> str:
        return json.dumps(
            {
                "samples": self.samples,
                "label_counts": {str(k): v for k, v in sorted(self.label_counts.items())},
            },
            sort_keys=True,
        )

    def counts(self, num_classes: int, where: str = "split") -> list[int]:
        """Samples per label id 0..num_classes-1; an id outside that range is an error naming
        ``where``.
        """
        out = [0] * num_classes
        for label, n in self.label_counts.items():
            if not 0 <= label < num_classes:
                raise ContractError(f"{where}: label {label} outside 0..{num_classes - 1}")
            out[label] = n
        return out


def read_split_stats(split_url: str, fs=None) -> SplitStats:
    """``{split_url}/split_stats.json``; a split published before the file existed is a clear
    error.
    """
    url = f"{split_url.rstrip('/')}/{SPLIT_STATS_FILE}"
    fs, path = _fs_and_path(url, fs)
    if not fs.exists(path):
        raise ContractError(
            f"{url} is missing (shards written by an older version): re-materialize mds_shards"
        )
    obj = read_json(path, fs)
    return SplitStats(
        samples=int(obj["samples"]),
        label_counts={int(k): int(v) for k, v in obj["label_counts"].items()},
    )


class ValidationPoint(BaseModel):
    """One validation of the run: where it was taken and the selection metric's value."""

    model_config = ConfigDict(extra="forbid")

    epoch: int  # 1-based: the epoch the validation ran in (its end, unless validating by steps)
    step: int  # optimizer steps done
    value: float


class ModelSelection(BaseModel):
    """Which weights the run exported and tested, and why (the trainer's ``select_model``)."""

    model_config = ConfigDict(extra="forbid")

    metric: str  # what was maximized, e.g. "val/macro_f1"
    selected: str  # "best" (the best validation's weights) or "last"
    # the validation whose weights were exported; None when nothing was validated
    best_epoch: int | None = None
    best_step: int | None = None
    best_value: float | None = None
    early_stopped: bool = False
    early_stopping_patience: int | None = None
    stopped_at_epoch: int | None = None  # 1-based, when early stopping fired
    curve: list[ValidationPoint] = []  # every validation, in order
    note: str | None = None  # e.g. why the last weights were exported under "best"


class TrainingResult(BaseModel):
    """What the trainer's rank 0 writes as ``metrics.json`` and finetuned_model reads (never by key
    strings).

    Test scores are None (with ``test_skipped`` saying why) when the test split is empty.
    """

    model_config = ConfigDict(extra="forbid")

    accuracy: float | None = None
    macro_f1: float | None = None
    f1_per_class: dict[str, float] = {}
    confusion_matrix: list[list[int]] | None = (
        None  # rows true, columns predicted, in ``labels`` order
    )
    test_samples: int = 0
    test_skipped: str | None = None
    samples_seen: int
    tokens_seen: int
    train_seconds: float
    samples_per_sec: (
        float  # over the steady-state window (``throughput``), the whole training time without one
    )
    tokens_per_sec: float
    # The steady-state window (training steps only: no start-up, validation or checkpoint saves),
    # what it covers, and MFU where the device's peak is known (core/training/throughput.py).
    throughput: dict[str, Any] = {}
    global_step: int
    epochs: int
    resumed_from: str | None = None
    resumed_at_step: int | None = None
    nonfinite_skipped: int = (
        0  # optimizer steps skipped for a non-finite loss (nonfinite_loss skip)
    )
    world_size: int
    strategy: str | None = None  # as run ("ddp", "fsdp", "auto")
    # Parameter elements each rank holds, in rank order: the model's size on every rank under DDP,
    # about size / ranks under FSDP (the proof that it shards).
    parameters_per_rank: list[int] | None = None
    precision: str | None = None  # what "auto" resolved to on the training machine
    class_weights: list[float] | None = None
    train_shards_cached_per_node: list[int | None] | None = None
    labels: list[str]  # class names in id order
    wall_seconds: float
    timings: dict[str, float] = {}  # seconds per phase
    mlflow: dict[str, Any] = {}  # run_id, experiment_id, run_url, registered_model_name/_version
    # best-validation selection and early stopping; None in results written before they existed
    model_selection: ModelSelection | None = None
    # what the trainer chose for the device it ran on (core/training/device_settings.py): batch,
    # eval
    # batch, loader workers, attention kernels (and why not SDPA), compiled encoder blocks
    device_settings: dict[str, Any] = {}

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def read_training_result(attempt_url: str, fs=None) -> TrainingResult:
    url = f"{attempt_url}/{TRAINING_RESULT_FILE}"
    try:
        return TrainingResult.model_validate(read_json(url, fs))
    except ValueError as err:
        raise ContractError(f"{url}: not a TrainingResult: {err}") from err
