"""One MLflow tracking-URI rule for the resource, the trainer and the CLI; one Markdown-table
writer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from finetune_assets.cli import common as cli_common
from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.io import tracking
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.export import trainer_tracking_uri
from finetune_assets.defs.resources.mlflow import MlflowResource


def test_explicit_then_environment_then_embedded_sqlite(tmp_path, monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    assert tracking.tracking_uri("http://mlflow:5000", str(tmp_path), "fix") == "http://mlflow:5000"
    assert (
        tracking.tracking_uri(None, str(tmp_path / "x"), "fix")
        == f"sqlite:///{tmp_path}/x/mlflow.db"
    )
    monkeypatch.setenv(tracking.TRACKING_ENV, "http://env:5000")
    assert tracking.tracking_uri(None, str(tmp_path), "fix") == "http://env:5000"


def test_a_remote_folder_without_a_uri_names_the_fix(monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    with pytest.raises(ValueError, match=r"s3://b/mlflow is remote .* pass --tracking-uri"):
        tracking.tracking_uri(None, "s3://b/mlflow", "pass --tracking-uri")


def test_resource_cli_and_trainer_agree(tmp_path, monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    monkeypatch.delenv("FINETUNE_ASSETS_ROOT", raising=False)
    root = tmp_path / "root"
    expected = f"sqlite:///{root}/mlflow/mlflow.db"
    assert MlflowResource().resolve_tracking_uri(Storage(str(root))) == expected
    assert (
        cli_common.tracking_uri_of(argparse.Namespace(tracking_uri=None, root=str(root)))
        == expected
    )
    trainer = TrainerConfig.from_dict(
        {
            "model_dir": "m",
            "output_dir": str(root / "mlflow"),
            "checkpoint_dir": "c",
            "data": {"train_url": "t", "validation_url": "v", "test_url": "e"},
        }
    )
    assert trainer_tracking_uri(trainer) == expected  # standalone: the store beside its output
    with pytest.raises(cli_common.CliError, match="pass --tracking-uri"):
        cli_common.tracking_uri_of(argparse.Namespace(tracking_uri=None, root="s3://bucket/prefix"))


def test_credentials_never_leave_in_a_uri_or_link():
    assert (
        tracking.safe_uri("https://user:token@mlflow.example:8443/x")
        == "https://mlflow.example:8443/x"
    )
    assert tracking.web_ui("https://user:token@mlflow.example") is None
    assert (
        tracking.run_url(tracking.web_ui("https://mlflow.example/"), "1", "abc")
        == "https://mlflow.example/#/experiments/1/runs/abc"
    )


def test_markdown_table_escapes_cells_that_would_break_a_row():
    table = viz.markdown_table(("file", "text"), [("a.csv", "good | bad\nnext")])
    assert table.splitlines() == ["| file | text |", "|---|---|", "| a.csv | good \\| bad next |"]


def test_the_storage_root_default_has_one_place(monkeypatch):
    from finetune_assets.core.io.storage import DEFAULT_ROOT, default_root
    from finetune_assets.defs.resources.storage_root import StorageResource

    monkeypatch.delenv("FINETUNE_ASSETS_ROOT", raising=False)
    assert StorageResource().root == DEFAULT_ROOT == default_root()
    assert cli_common.root_of(argparse.Namespace(root=None)) == DEFAULT_ROOT
    assert Path(DEFAULT_ROOT).name == ".finetune_assets"


def _open_fresh_store_at_once(root: str, barrier, i: int) -> None:
    from mlflow import MlflowClient

    from finetune_assets.core.io.storage import Storage
    from finetune_assets.defs.resources.mlflow import MlflowResource

    barrier.wait(timeout=120)  # every process opens the fresh store at the same moment
    uri = MlflowResource().resolve_tracking_uri(Storage(root))
    MlflowClient(tracking_uri=uri).create_experiment(f"version-{i}")


def test_runs_opening_a_fresh_embedded_store_at_once_all_succeed(tmp_path, monkeypatch):
    """Several versions' data-preparation runs start together on a fresh storage root (a sensor
    tick, a backfill): without a tracking server each opens the embedded SQLite store, whose
    first open creates the tables. Unserialized, those migrations race and some runs fail.
    """
    import multiprocessing

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(3)
    procs = [
        ctx.Process(target=_open_fresh_store_at_once, args=(str(tmp_path), barrier, i))
        for i in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0, 0]
