"""Shared fixtures: a tiny BERT built from a config, the real review files, a storage root, an instance."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "arabic_reviews"
if not SHARED_DATA.exists():  # CI clones main beside a copy of shared/; sessions run from /work/main
    SHARED_DATA = Path("/work/shared/data/arabic_reviews")


@pytest.fixture(autouse=True)
def _isolate_mlflow_globals():
    """``mlflow.set_tracking_uri/set_registry_uri`` also set ``MLFLOW_*_URI`` in ``os.environ``; a test
    that calls them (directly or through the CLI in-process) must not point later tests' subprocesses
    (torchrun trainers, ``dagster`` CLI runs) at its own store."""
    keys = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    saved = {k: os.environ.get(k) for k in keys}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if "mlflow" in sys.modules:
        from mlflow.tracking._model_registry import utils as registry_utils
        from mlflow.tracking._tracking_service import utils as tracking_utils

        tracking_utils._tracking_uri = None
        registry_utils._registry_uri = None


@pytest.fixture(scope="session")
def arabic_reviews() -> Path:
    """Folder with PROD.csv, ATT.csv, RES2.csv (real, messy, read-only)."""
    if not SHARED_DATA.exists():
        pytest.skip("shared/data/arabic_reviews is not available")
    return SHARED_DATA


@pytest.fixture(scope="session")
def _tiny_model_session(tmp_path_factory) -> Path:
    from finetune_assets.data.models import build_tiny_bert

    out = tmp_path_factory.mktemp("tiny-bert")
    build_tiny_bert(out)
    return out


@pytest.fixture
def tiny_model_dir(_tiny_model_session: Path, tmp_path: Path) -> Path:
    """A 2-layer, 32-wide BertForSequenceClassification folder (real WordPiece vocab), copied per test."""
    dst = tmp_path / "tiny-bert"
    shutil.copytree(_tiny_model_session, dst)
    return dst


@pytest.fixture
def storage_root(tmp_path: Path) -> Path:
    root = tmp_path / "storage"
    root.mkdir()
    return root


@pytest.fixture
def instance(tmp_path: Path):
    import dagster as dg

    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as inst:
        yield inst
