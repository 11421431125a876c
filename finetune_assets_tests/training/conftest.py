"""Fixtures for the trainer tests: MDS shards of real reviews for the tiny BERT."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_assets_tests.training.fixtures import write_mds_splits


@pytest.fixture
def mds_root(tmp_path: Path, tiny_model_dir: Path, arabic_reviews: Path) -> Path:
    return write_mds_splits(tmp_path / "shards", tiny_model_dir, arabic_reviews / "PROD.csv")
