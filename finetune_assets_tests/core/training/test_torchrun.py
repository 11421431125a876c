"""End to end through ``torchrun --standalone --nproc-per-node 2`` on CPU (gloo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.launchers.base import TrainingFailed, TrainingSpec, torchrun_command
from finetune_assets.defs.resources.launchers import LocalTorchrunLauncher
from finetune_assets_tests.core.training.fixtures import write_mds_splits
from finetune_assets_tests.processes import kill_tree

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]


def write_config(root: Path, name: str, model_dir: Path, shards: Path, **overrides) -> Path:
    run = root / name
    cfg = {
        "model_dir": str(model_dir),
        "output_dir": str(run / "out"),
        "checkpoint_dir": str(run / "ckpt"),
        "accelerator": "cpu",
        "epochs": 2,  # the runs below count samples over two epochs (the product default is one)
        "checkpoint_every_n_steps": 3,
        "log_every_n_steps": 2,
        "num_workers": 0,
        "batch_size": 4,
        "data": {
            "train_url": str(shards / "train"),
            "train_label_counts": read_split_stats(str(shards / "train")).counts(3),
            "validation_url": str(shards / "validation"),
            "test_url": str(shards / "test"),
        },
        "mlflow": {
            "tracking_uri": f"sqlite:///{root}/mlflow.db",
            "artifact_location": str(root / "mlartifacts"),
            "tags": {"dataset_version": "v1", "shard_data_version": "abc", "code_version": "test"},
            "log_model": False,
        },
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            cfg[key] = {**cfg.get(key, {}), **value}
        else:
            cfg[key] = value
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(json.dumps(cfg))
    return run / "config.json"


def torchrun(config: Path, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = torchrun_command(str(config), nproc_per_node=2, python=sys.executable)
    return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, **popen)


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def run_ok(config: Path) -> dict:
    proc = torchrun(config, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return json.loads((config.parent / "out" / "metrics.json").read_text())


@pytest.fixture(scope="module")
def world(tmp_path_factory, _tiny_model_session, arabic_reviews):
    root = tmp_path_factory.mktemp("torchrun")
    shards = write_mds_splits(root / "shards", _tiny_model_session, arabic_reviews / "PROD.csv")
    return root, _tiny_model_session, shards


@pytest.fixture(scope="module")
def full_run(world):
    """An uninterrupted 2-process run that also logs and registers the model in MLflow."""
    root, model, shards = world
    config = write_config(
        root,
        "full",
        model,
        shards,
        gradient_clip_val=1.0,
        mlflow={"log_model": True, "registered_model_name": "tiny-reviews"},
    )
    return root, config, run_ok(config)


def _logits(model_dir: Path, texts: list[str]):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        return model(**tok(texts, padding=True, return_tensors="pt")).logits


def test_two_process_fsdp_shards_and_matches_ddp_through_test_export_and_predict(world, full_run):
    """FSDP (FSDP2 on gloo) runs fit -> validation -> test -> export -> predict, then a re-run
    resumes at the end.

    Lightning's FSDP refused CPU, and after fit its ``trainer.test()`` re-wrapped the wrapped model
    ("'weight' must be 2-D"). Same data, seed and clipping as the DDP run: the same test metrics,
    and exported logits within 1e-4 (only the order of the gradient sums differs).
    """
    root, model, shards = world
    _, ddp_config, ddp = full_run
    config = write_config(root, "fsdp", model, shards, strategy="fsdp", gradient_clip_val=1.0)
    fsdp = run_ok(config)
    assert fsdp["strategy"] == "fsdp" and ddp["strategy"] == "ddp"
    total = ddp["parameters_per_rank"][0]
    assert ddp["parameters_per_rank"] == [total, total]
    assert (
        sum(fsdp["parameters_per_rank"]) == total and max(fsdp["parameters_per_rank"]) < 0.6 * total
    )
    for key in ("global_step", "samples_seen", "tokens_seen", "confusion_matrix", "accuracy"):
        assert fsdp[key] == ddp[key], key
    assert abs(fsdp["macro_f1"] - ddp["macro_f1"]) < 1e-6
    texts = ["منتج ممتاز", "سيء جدا", "الخدمة عادية لكن السعر مرتفع"]
    a, b = (
        _logits(config.parent / "out" / "model", texts),
        _logits(ddp_config.parent / "out" / "model", texts),
    )
    assert (a - b).abs().max() < 1e-4, (a - b).abs().max()

    # the final checkpoint exists: resume (sharded load) at the end, test and export again
    again = run_ok(config)
    assert again["resumed_from"] and again["global_step"] == fsdp["global_step"]
    assert again["confusion_matrix"] == fsdp["confusion_matrix"]


def test_two_process_run_saves_a_pipeline_loadable_model(full_run):
    from transformers import pipeline

    root, config, metrics = full_run
    assert metrics["world_size"] == 2
    # 2 epochs over 96 training reviews, all ranks together
    assert metrics["samples_seen"] == 2 * 96
    assert 0.0 <= metrics["accuracy"] <= 1.0 and set(metrics["f1_per_class"]) == {
        "Positive",
        "Negative",
        "Mixed",
    }
    assert sum(map(sum, metrics["confusion_matrix"])) >= 24
    model_dir = config.parent / "out" / "model"
    assert (model_dir / "model.safetensors").exists()
    clf = pipeline("text-classification", model=str(model_dir), device=-1)
    pred = clf(["منتج ممتاز", "سيء جدا"])
    assert {p["label"] for p in pred} <= {"Positive", "Negative", "Mixed"}


def test_two_process_run_is_recorded_in_mlflow(full_run):
    from mlflow import MlflowClient

    root, _, metrics = full_run
    info = metrics["mlflow"]
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    run = client.get_run(info["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["optimizer"] == "adamw"
    assert {
        "train/loss_step",
        "val/accuracy",
        "test/macro_f1",
        "throughput/samples_per_sec",
    } <= set(run.data.metrics)
    assert len(client.get_metric_history(info["run_id"], "train/loss_step")) > 3  # per-step history
    assert run.data.tags["dataset_version"] == "v1"
    artifacts = {a.path for a in client.list_artifacts(info["run_id"])}
    assert {"confusion_matrix.png", "metrics.json"} <= artifacts
    assert info["registered_model_name"] == "tiny-reviews"
    version = client.get_model_version("tiny-reviews", str(info["registered_model_version"]))
    assert version.tags["shard_data_version"] == "abc" and version.run_id == info["run_id"]


def test_killed_run_resumes_without_repeating_or_skipping(world, full_run):
    root, model, shards = world
    _, _, reference = full_run
    config = write_config(root, "killed", model, shards)
    last = config.parent / "ckpt" / "last.ckpt"
    proc = torchrun(config, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    # torchrun and every worker (own sessions), right after a checkpoint
    kill_tree(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL and last.exists(), (
        "the run ended before it could be killed"
    )
    time.sleep(1.0)
    assert not [
        p for p in Path("/proc").iterdir() if p.name.isdigit() and str(config) in _cmdline(p)
    ]
    assert not (config.parent / "out" / "metrics.json").exists()

    resumed = run_ok(config)
    assert resumed["resumed_from"] == str(last)
    assert 0 < resumed["resumed_at_step"] < reference["global_step"]
    # Same samples, each exactly once: counts and the (order-free) token total match the
    # uninterrupted run.
    assert resumed["samples_seen"] == reference["samples_seen"]
    assert resumed["tokens_seen"] == reference["tokens_seen"]
    assert resumed["global_step"] == reference["global_step"]


def test_trainer_crash_fails_the_launcher_with_a_readable_error(tmp_path, world):
    _, model, shards = (
        world  # the module's shards and model (read-only here): only validation_url is broken
    )
    config = write_config(
        tmp_path, "crash", model, shards, data={"validation_url": str(tmp_path / "missing")}
    )
    launcher = LocalTorchrunLauncher(nproc_per_node=2, cwd=str(REPO))
    context = dg.build_asset_context()
    with pytest.raises(TrainingFailed) as err:
        launcher.launch(context, TrainingSpec(name="crash-test", config_url=str(config)))
    message = str(err.value)
    assert "crash-test" in message and "exit code" in message
    assert "no MDS dataset" in message and str(tmp_path / "missing") in message


def test_cancellation_kills_torchrun_and_every_worker(world):
    """Dagster terminates a run by interrupting the step; the launcher must leave no worker
    behind.
    """
    root, model, shards = world
    config = write_config(root, "cancel", model, shards, epochs=50)
    launcher = LocalTorchrunLauncher(nproc_per_node=2, cwd=str(REPO))
    context = dg.build_asset_context()
    started = time.monotonic()

    def interrupt(signum, frame):
        # what Dagster's termination raises in the step (as DagsterExecutionInterruptedError)
        raise KeyboardInterrupt

    def training_started() -> bool:
        return (config.parent / "ckpt" / "last.ckpt").exists()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:

        def arm(_signum=None, _frame=None):
            if training_started() or time.monotonic() - started > 240:
                interrupt(None, None)
            signal.setitimer(signal.ITIMER_REAL, 0.2)

        signal.signal(signal.SIGALRM, arm)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            launcher.launch(context, TrainingSpec(name="cancel-test", config_url=str(config)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert training_started(), "training never reached its first checkpoint"
    time.sleep(1.0)
    leftovers = [
        p.name for p in Path("/proc").iterdir() if p.name.isdigit() and str(config) in _cmdline(p)
    ]
    assert not leftovers, f"processes still running after cancellation: {leftovers}"
