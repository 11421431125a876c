"""The trainer's callbacks: progress lines a person can read, run totals that survive a resume, and
the progress reaching MLflow as metrics in a real (tiny) ``train()``.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import mlflow
import pytest
import torch

from finetune_assets.core.training import PROGRESS
from finetune_assets.core.training.callbacks import Progress, Throughput
from finetune_assets.core.training.run import train
from finetune_assets_tests.core.training.fixtures import write_mds_splits
from finetune_assets_tests.core.training.test_train import trainer_config


class _Logger:
    """Stands in for the MLFlowLogger: records ``log_metrics`` calls; no store, no run."""

    def __init__(self):
        self.calls: list[tuple[dict, int]] = []

    def log_metrics(self, metrics, step):
        self.calls.append((dict(metrics), step))


def _trainer(**kw):
    """A Trainer's attributes the callbacks read; ``reduce`` is the identity of a 1-process
    group.
    """
    base = dict(
        global_step=0,
        world_size=1,
        current_epoch=0,
        max_epochs=2,
        max_steps=-1,
        is_global_zero=True,
        estimated_stepping_batches=40,
        logger=_Logger(),
        log_every_n_steps=1000,
        accumulate_grad_batches=1,
        strategy=SimpleNamespace(root_device=torch.device("cpu"), reduce=lambda t, reduce_op: t),
    )
    return SimpleNamespace(**{**base, **kw})


def _batch(n: int, tokens: int) -> dict:
    return {"labels": torch.zeros(n, dtype=torch.long), "num_samples": n, "num_tokens": tokens}


def test_progress_line_says_step_total_epoch_loss_rate_and_eta(caplog):
    throughput = Throughput()
    progress = Progress(throughput, every_seconds=3600, logger=logging.getLogger("test.progress"))
    trainer = _trainer()
    throughput.on_train_start(trainer, None)
    throughput.on_train_epoch_start(trainer, None)
    progress.on_train_start(trainer, None)
    for step, loss in enumerate([1.0, 0.5, 0.0, 0.5], start=1):
        throughput.on_train_batch_end(
            trainer, None, {"loss": torch.tensor(loss)}, _batch(8, 100), step - 1
        )
        progress.on_train_batch_end(
            trainer, None, {"loss": torch.tensor(loss)}, _batch(8, 100), step - 1
        )
        trainer.global_step = step
    assert not caplog.records  # the interval (an hour) has not passed: nothing yet
    time.sleep(0.01)
    with caplog.at_level(logging.INFO, logger="test.progress"):
        line = progress.report(trainer)
    assert caplog.messages == [line]
    assert line.startswith(f"{PROGRESS} step 4/40 (10%) | epoch 1/2 | loss 0.5000 | ")
    assert " samples/s | ETA 0:" in line
    metrics, step = trainer.logger.calls[-1]
    assert (
        step == 4
        and metrics["progress/fraction"] == pytest.approx(0.1)
        and metrics["progress/loss"] == 0.5
    )
    assert metrics["progress/samples_per_sec"] > 0 and metrics["progress/eta_seconds"] > 0


def test_progress_reports_on_its_interval_without_a_step_count():
    throughput = Throughput()
    lines: list[str] = []
    log = logging.getLogger("test.progress.interval")
    log.addHandler(handler := logging.Handler())
    handler.emit = lambda record: lines.append(record.getMessage())
    log.setLevel(logging.INFO)
    progress = Progress(throughput, every_seconds=0.0, logger=log)
    trainer = _trainer(estimated_stepping_batches=float("inf"))
    progress.on_train_start(trainer, None)
    progress.on_train_batch_end(trainer, None, {"loss": torch.tensor(0.25)}, _batch(4, 10), 0)
    assert (
        len(lines) == 1
        and lines[0].startswith(f"{PROGRESS} step 0 | ")
        and lines[0].endswith("ETA ?")
    )
    progress.on_train_batch_end(
        _trainer(is_global_zero=False), None, {"loss": torch.tensor(1.0)}, _batch(4, 10), 1
    )
    assert len(lines) == 1  # only rank 0 reports


def test_throughput_totals_travel_in_the_checkpoint():
    first, trainer = Throughput(), _trainer()
    first.on_train_epoch_start(trainer, None)
    for i in range(3):
        first.on_train_batch_end(trainer, None, None, _batch(8, 64), i)
    checkpoint: dict = {"review_classifier": {"world_size": 1}}
    first.on_save_checkpoint(trainer, None, checkpoint)
    # the module's entry is kept beside the totals
    assert checkpoint["review_classifier"]["world_size"] == 1
    assert (
        checkpoint["review_classifier"]["samples_seen"] == 24
        and checkpoint["review_classifier"]["tokens_seen"] == 192
    )
    resumed = Throughput()
    resumed.on_load_checkpoint(trainer, None, checkpoint)
    assert (resumed.samples_seen, resumed.tokens_seen) == (24, 192)
    assert resumed.train_seconds == pytest.approx(checkpoint["review_classifier"]["train_seconds"])


def test_train_logs_progress_lines_and_progress_metrics(
    tmp_path, tiny_model_dir, arabic_reviews, caplog
):
    shards = write_mds_splits(
        tmp_path / "published", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(24, 8, 8)
    )
    config = trainer_config(tmp_path, tiny_model_dir, shards, progress_every_seconds=1)
    with caplog.at_level(logging.INFO, logger="finetune_assets.core.training"):
        metrics = train(config)
    lines = [m for m in caplog.messages if m.startswith(PROGRESS)]
    # 24 samples / batch 8
    assert lines and lines[-1].startswith(f"{PROGRESS} step 3/3 (100%) | epoch 1/1 | loss ")
    assert lines[-1].endswith("ETA 0:00:00")
    client = mlflow.MlflowClient(config.mlflow.tracking_uri)
    history = client.get_metric_history(metrics["mlflow"]["run_id"], "progress/fraction")
    assert history and history[-1].value == 1.0 and history[-1].step == 3


def test_steady_state_throughput_leaves_out_checkpoint_saves(
    tmp_path, tiny_model_dir, arabic_reviews, monkeypatch
):
    """A checkpoint save that takes 1000 s (on a shifted clock, no real wait) appears in the
    training time but in no steady-state interval; the first steps and the epoch's last are left out
    too.
    """
    import types

    from finetune_assets.core.training import throughput
    from finetune_assets.core.training.checkpoints import trainer_files as files

    shift = {"s": 0.0}
    monkeypatch.setattr(
        throughput,
        "time",
        types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + shift["s"]),
    )
    save = files.AtomicCheckpointIO.save_checkpoint

    def slow_save(self, *args, **kwargs):
        shift["s"] += 1000.0
        return save(self, *args, **kwargs)

    monkeypatch.setattr(files.AtomicCheckpointIO, "save_checkpoint", slow_save)
    shards = write_mds_splits(
        tmp_path / "published", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(48, 8, 8)
    )
    config = trainer_config(
        tmp_path, tiny_model_dir, shards, batch_size=4, checkpoint_every_n_steps=3, bucket_batches=1
    )
    metrics = train(config)
    window = metrics["throughput"]
    # saves after steps 3, 6, 9, 12
    assert metrics["global_step"] == 12 and metrics["train_seconds"] > 4000
    # 12 batches: 1-2 warm-up, 3/6/9 end in a save, 12 is the last: batches 4, 5, 7, 8, 10, 11
    # remain
    assert window["window_batches"] == 6 and window["window_first_step"] == 3
    assert 0 < window["window_seconds"] < 1000
    assert metrics["samples_per_sec"] == pytest.approx(window["samples_per_sec"])
    assert window["samples_per_sec"] > metrics["samples_seen"] / 4000
    assert window["flops_per_sec"] > 0 and window["mfu"] is None  # no known peak on a CPU


def test_training_flops_formula_matches_torch_flop_counter():
    """``train_flops`` against torch's own count of one forward + backward, for two batch shapes."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForSequenceClassification, BertConfig

    from finetune_assets.core.training.throughput import train_flops

    model = AutoModelForSequenceClassification.from_config(
        BertConfig(
            num_labels=3,
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=2,
            intermediate_size=128,
            vocab_size=500,
        )
    )
    a, b, c = train_flops(model)
    for batch, length in ((2, 16), (3, 40)):
        ids = torch.randint(5, 400, (batch, length))
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.sum().backward()
        assert counter.get_total_flops() == batch * (a * length + b * length * length + c)


@pytest.mark.parametrize(
    "name, variant",
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10", "A10"),
        ("Tesla T4", None),
    ],
)
def test_peak_flops_by_device_variant(name, variant):
    """An H100 PCIe peaks at 756 TFLOP/s, not an SXM's 989: the variant sets MFU's denominator."""
    from finetune_assets.core.training.throughput import device_variant

    assert device_variant(name) == variant
