"""The published artifacts' contracts: what a producer writes is what its consumers read, or a
clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from finetune_assets.core.io.contracts import (
    ACCEPTED_SCHEMA,
    ContractError,
    TrainingResult,
    read_reviews,
    read_split_stats,
    read_training_result,
)
from finetune_assets.core.prep.validate import SplitRule, ValidationRules, normalize_text, validate

RESULT = {
    "accuracy": 0.5,
    "macro_f1": 0.4,
    "f1_per_class": {"Positive": 0.6, "Negative": 0.2},
    "confusion_matrix": [[3, 1], [2, 2]],
    "test_samples": 8,
    "samples_seen": 64,
    "tokens_seen": 900,
    "train_seconds": 1.5,
    "samples_per_sec": 42.0,
    "tokens_per_sec": 600.0,
    "global_step": 8,
    "epochs": 1,
    "world_size": 1,
    "class_weights": [0.8, 1.3],
    "train_shards_cached_per_node": [2],
    "labels": ["Positive", "Negative"],
    "wall_seconds": 3.0,
    "timings": {"fit": 1.5},
}


def test_validate_stores_a_split_that_depends_only_on_the_normalized_text():
    raw = pa.table(
        {
            "text": ["Great phone", "\u200f  great   PHONE ", "awful"],
            "label": ["Positive", "Positive", "Negative"],
            "source_file": ["a.csv"] * 3,
            "source_row": [0, 1, 2],
        }
    )
    result = validate(raw, ValidationRules(split=SplitRule(validation=0.3, test=0.3)))
    assert result.accepted.schema == ACCEPTED_SCHEMA
    # the RLM copy is the same review
    assert result.rejected.column("reason").to_pylist() == ["duplicate"]
    rule = SplitRule(validation=0.3, test=0.3)
    assert result.accepted.column("split").to_pylist() == rule.assign(["Great phone", "awful"])
    assert rule.of_key(normalize_text("\u200f  great   PHONE ")) == rule.assign(["Great phone"])[0]


def test_reviews_without_the_split_column_are_refused_with_the_fix(tmp_path: Path):
    pq.write_table(pa.table({"text": ["x"], "label": ["Positive"]}), tmp_path / "reviews.parquet")
    with pytest.raises(ContractError, match="re-materialize raw_reviews"):
        read_reviews(str(tmp_path))


def test_training_result_round_trips_and_refuses_unknown_or_missing_keys(tmp_path: Path):
    (tmp_path / "metrics.json").write_text(json.dumps(RESULT))
    result = read_training_result(str(tmp_path))
    assert result == TrainingResult(**RESULT) and result.labels == ["Positive", "Negative"]
    assert TrainingResult.model_validate_json(result.to_json()) == result
    (tmp_path / "metrics.json").write_text(json.dumps({**RESULT, "macro_f1_typo": 1.0}))
    with pytest.raises(ContractError, match="macro_f1_typo"):
        read_training_result(str(tmp_path))
    (tmp_path / "metrics.json").write_text(
        json.dumps({k: v for k, v in RESULT.items() if k != "samples_seen"})
    )
    with pytest.raises(ContractError, match="samples_seen"):
        read_training_result(str(tmp_path))


def test_split_stats_counts_name_the_split_when_a_label_is_out_of_range(tmp_path: Path):
    (tmp_path / "split_stats.json").write_text(
        json.dumps({"samples": 5, "label_counts": {"0": 2, "2": 3}})
    )
    stats = read_split_stats(str(tmp_path))
    assert stats.counts(3) == [2, 0, 3]
    with pytest.raises(ContractError, match="mds_shards\\[v1\\]/train: label 2 outside 0..1"):
        stats.counts(2, where="mds_shards[v1]/train")
