"""Fixtures for the pure data path: the real review files, the real WordPiece tokenizer,
independent counts.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest


def count_csv_rows(path: Path, encoding: str = "utf-8", delimiter: str = ",") -> int:
    """Data rows of a CSV counted with Python's csv module (independent of the pyarrow reader)."""
    with path.open(newline="", encoding=encoding) as f:
        rows = [r for r in csv.reader(f, delimiter=delimiter) if r]
    return len(rows) - 1  # header


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="session")
def tokenizer():
    """The packaged model's fast tokenizer (the bert-base-uncased WordPiece vocabulary), as
    tiny_model_dir has.
    """
    from transformers import AutoTokenizer

    from finetune_assets.core.prep.pretrained import packaged_model_dir

    return AutoTokenizer.from_pretrained(packaged_model_dir(), use_fast=True)
