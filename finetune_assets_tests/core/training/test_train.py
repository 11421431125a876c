"""``train()`` in one process (tiny BERT, real reviews): published shards untouched, empty
splits, class weights.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.data.datamodule import MdsDataModule
from finetune_assets.core.training.hyperparameters import HyperParameters
from finetune_assets.core.training.module import ReviewClassifier, load_classifier
from finetune_assets.core.training.precision import resolve_precision
from finetune_assets.core.training.run import train
from finetune_assets_tests.core.training.fixtures import write_mds_splits, write_split


def trainer_config(root: Path, model_dir: Path, shards: Path, **overrides) -> TrainerConfig:
    cfg = {
        "model_dir": str(model_dir),
        "output_dir": str(root / "out"),
        "checkpoint_dir": str(root / "ckpt"),
        "accelerator": "cpu",
        "epochs": 1,
        "checkpoint_every_n_steps": 5,
        "log_every_n_steps": 2,
        "num_workers": 0,
        "batch_size": 8,
        "data": {
            "train_url": str(shards / "train"),
            "train_label_counts": read_split_stats(str(shards / "train")).counts(3),
            "validation_url": str(shards / "validation"),
            "test_url": str(shards / "test"),
        },
        "mlflow": {
            "tracking_uri": f"sqlite:///{root}/mlflow.db",
            "artifact_location": str(root / "mlartifacts"),
            "log_model": False,
        },
    }
    for key, value in overrides.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    return TrainerConfig.from_dict(cfg)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path) with its content hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def shards(tmp_path, tiny_model_dir, arabic_reviews) -> Path:
    return write_mds_splits(
        tmp_path / "published", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(48, 12, 12)
    )


def test_training_never_writes_into_the_published_shards(tmp_path, tiny_model_dir, shards):
    before = snapshot(shards)
    assert any(name.endswith(".mds.zstd") for name in before) and not any(
        name.endswith(".mds") for name in before
    )
    config = trainer_config(tmp_path, tiny_model_dir, shards)
    derived_cache = Path(MdsDataModule(config, run_key=config.checkpoint_dir).cache_dir)

    metrics = train(config)

    assert metrics["samples_seen"] == 48 and metrics["test_samples"] == 12
    # "auto" is resolved on the training machine and recorded, in metrics.json and the MLflow params
    assert metrics["precision"] == resolve_precision("auto", "cpu") in ("bf16-mixed", "32-true")
    assert (
        json.loads((tmp_path / "out" / "metrics.json").read_text())["precision"]
        == metrics["precision"]
    )
    from mlflow import MlflowClient

    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(metrics["mlflow"]["run_id"])
    assert run.data.params["precision"] == metrics["precision"]
    # no decompressed .mds, no index rewrite, nothing added or changed
    assert snapshot(shards) == before
    # removed after a successful run
    assert not derived_cache.exists() and not derived_cache.parent.exists()


def test_a_given_cache_dir_receives_the_decompressed_shards_and_is_kept(
    tmp_path, tiny_model_dir, shards
):
    before = snapshot(shards)
    cache = tmp_path / "cache"
    train(trainer_config(tmp_path, tiny_model_dir, shards, data={"local_cache_dir": str(cache)}))
    assert snapshot(shards) == before
    for split in ("train", "validation", "test"):  # each split in its own local folder
        assert (cache / split / "index.json").exists() and list((cache / split).glob("*.mds"))


def test_empty_validation_and_test_splits(tmp_path, tiny_model_dir, arabic_reviews):
    """A tiny version may have no validation or test rows: it trains, and metrics say the test
    was skipped.
    """
    shards = write_mds_splits(
        tmp_path / "published", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(24, 0, 0)
    )
    metrics = train(trainer_config(tmp_path, tiny_model_dir, shards))
    assert metrics["samples_seen"] == 24
    assert (
        metrics["test_samples"] == 0 and metrics["accuracy"] is None and metrics["macro_f1"] is None
    )
    assert "test split" in metrics["test_skipped"] and "empty" in metrics["test_skipped"]
    assert (tmp_path / "out" / "model" / "model.safetensors").exists()


def test_empty_train_split_is_a_clear_error(tmp_path, tiny_model_dir, arabic_reviews):
    shards = write_mds_splits(
        tmp_path / "published", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(0, 6, 6)
    )
    with pytest.raises(ValueError, match=r"train split at .*/train has no samples"):
        train(trainer_config(tmp_path, tiny_model_dir, shards))


def test_balanced_class_weights_change_the_training_loss(tiny_model_dir):
    logits = torch.tensor([[2.0, 0.1, -1.0], [0.5, 1.5, 0.0], [0.2, 0.3, 0.1], [1.0, 0.0, 0.5]])
    labels = torch.tensor([0, 0, 1, 2])
    model = load_classifier(str(tiny_model_dir))
    plain = ReviewClassifier(model, HyperParameters()).train_loss(logits, labels)
    weights = [0.5, 2.0, 3.0]
    weighted = ReviewClassifier(model, HyperParameters(), class_weights=weights).train_loss(
        logits, labels
    )
    per_sample = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    w = torch.tensor(weights)[labels]
    assert plain == pytest.approx(per_sample.mean().item())
    assert weighted == pytest.approx((w * per_sample).sum().item() / w.sum().item())
    assert abs(weighted.item() - plain.item()) > 0.05
    with pytest.raises(ValueError, match="needs 3 values"):
        ReviewClassifier(model, HyperParameters(), class_weights=[1.0, 2.0])


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # 10 steps, 2 of warmup: (step + 1) / 3, then from 1 down to 0 over the last 8
        ("linear", [1 / 3, 2 / 3, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]),
        ("cosine", [1 / 3, 2 / 3, 1.0, 0.962, 0.854, 0.691, 0.5, 0.309, 0.146, 0.038]),
        ("constant", [1 / 3, 2 / 3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ],
)
def test_lr_schedule_after_the_warmup(tiny_model_dir, monkeypatch, schedule, expected):
    module = ReviewClassifier(
        load_classifier(str(tiny_model_dir)),
        HyperParameters(lr=1.0, warmup_ratio=0.2, lr_schedule=schedule),
    )
    monkeypatch.setattr(ReviewClassifier, "total_steps", lambda self: 10)
    scheduler = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    factors = []
    for _ in range(10):
        factors.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    assert factors == pytest.approx(expected, abs=1e-3)


def test_balanced_class_weights_reach_the_trainer(tmp_path, tiny_model_dir, shards):
    skewed = tmp_path / "skewed"
    shutil.copytree(shards, skewed)
    shutil.rmtree(skewed / "train")
    write_split(
        skewed / "train", [[101, 2000 + i, 102] for i in range(20)], [0] * 14 + [1] * 4 + [2] * 2
    )
    metrics = train(trainer_config(tmp_path, tiny_model_dir, skewed, class_weights="balanced"))
    assert metrics["class_weights"] == pytest.approx([20 / 42, 20 / 12, 20 / 6])
    assert (
        train(trainer_config(tmp_path / "plain", tiny_model_dir, skewed, class_weights="none"))[
            "class_weights"
        ]
        is None
    )


def test_a_bf16_checkpoint_trains_with_fp32_master_weights_and_exports_fp32(
    tmp_path, tiny_model_dir, arabic_reviews
):
    """A checkpoint saved in bf16 is loaded as fp32: AdamW's state is fp32 (small updates are not
    rounded away) and the exported model is fp32 by default (``export_dtype``), under bf16 autocast.
    """
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification

    bf16_dir = tmp_path / "bf16-model"
    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir))
    model.to(torch.bfloat16).save_pretrained(bf16_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, bf16_dir / name)
    with safe_open(str(bf16_dir / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    shards = write_mds_splits(
        tmp_path / "published", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(24, 8, 8)
    )
    config = trainer_config(tmp_path, bf16_dir, shards, batch_size=8, precision="bf16-mixed")
    train(config)

    state = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)
    adam = state["optimizer_states"][0]["state"]
    moments = {t.dtype for s in adam.values() for k, t in s.items() if k.startswith("exp_avg")}
    assert adam and moments == {torch.float32}
    assert {v.dtype for k, v in state["state_dict"].items() if v.is_floating_point()} == {
        torch.float32
    }
    with safe_open(str(tmp_path / "out" / "model" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}

    bf16_out = trainer_config(
        tmp_path / "bf16-export", bf16_dir, shards, batch_size=8, export_dtype="bfloat16"
    )
    train(bf16_out)
    exported = tmp_path / "bf16-export" / "out" / "model" / "model.safetensors"
    with safe_open(str(exported), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


class _Crash(RuntimeError):
    """The process dying mid-epoch (raised in the trainer, as a kill would stop it there)."""


@pytest.mark.parametrize(
    "trigger",
    [
        # the time trigger, due from micro-batch 10 (inside step 3's window) on a shifted clock
        {"checkpoint_every_minutes": 1.0},
        {"checkpoint_every_n_steps": 1},
    ],
    ids=["time", "steps"],
)
def test_resume_under_gradient_accumulation_ends_with_the_uninterrupted_weights(
    tmp_path, tiny_model_dir, arabic_reviews, monkeypatch, trigger
):
    """``accumulate_grad_batches: 4`` (24 micro-batches, 6 steps). The run dies at micro-batch 15
    (3rd of step 4's window), its re-run dies there again, the third run finishes: it must end
    with the uninterrupted run's weights. A checkpoint saved inside an accumulation window (a
    time trigger due mid-window, or the step trigger's re-save on the first micro-batch after a
    resume) counts the window's micro-batches as consumed without their gradients. Tolerance:
    1e-6 absolute (same process, same order of operations: in practice equal).
    """
    import types

    from pytorch_lightning.callbacks import model_checkpoint
    from safetensors.torch import load_file

    from finetune_assets.core.training import throughput

    shards = write_mds_splits(
        tmp_path / "published", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(48, 8, 8)
    )
    settings = dict(
        batch_size=2,
        accumulate_grad_batches=4,
        log_every_n_steps=1,
        bucket_batches=1,
        class_weights="none",
        optimizer="adamw",
        lr=1e-3,
        **{"checkpoint_every_n_steps": None, **trigger},
    )
    shift = {"s": 0.0}
    monkeypatch.setattr(
        model_checkpoint,
        "time",
        types.SimpleNamespace(monotonic=lambda: time.monotonic() + shift["s"]),
    )
    start = throughput.Throughput.on_train_batch_start
    crashes = {"left": 0}

    def clock_and_kill(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 9:
            shift["s"] += 120.0  # a minute and more has passed: the time trigger is due
        if batch_idx == 14 and crashes["left"]:
            crashes["left"] -= 1
            raise _Crash("killed mid-accumulation")
        return start(self, trainer, pl_module, batch, batch_idx)

    monkeypatch.setattr(throughput.Throughput, "on_train_batch_start", clock_and_kill)
    reference = train(trainer_config(tmp_path / "whole", tiny_model_dir, shards, **settings))
    assert reference["global_step"] == 6

    killed = trainer_config(tmp_path / "killed", tiny_model_dir, shards, **settings)
    crashes["left"] = 2
    for _ in range(2):
        with pytest.raises(_Crash):
            train(killed)
        saved = torch.load(
            tmp_path / "killed" / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True
        )
        # right after step 3's optimizer step (micro-batch 12), never inside step 4's window
        assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"] == 12
    resumed = train(killed)
    assert resumed["resumed_at_step"] == 3 and resumed["global_step"] == 6
    assert resumed["samples_seen"] == reference["samples_seen"] == 48

    whole = load_file(tmp_path / "whole" / "out" / "model" / "model.safetensors")
    again = load_file(tmp_path / "killed" / "out" / "model" / "model.safetensors")
    assert whole.keys() == again.keys()
    for key in whole:
        torch.testing.assert_close(again[key], whole[key], rtol=0, atol=1e-6, msg=key)


def test_a_start_removes_the_shard_caches_of_earlier_attempts(tmp_path, tiny_model_dir, shards):
    """A killed attempt never removes its cache folder; the next start's local leader does."""
    config = trainer_config(tmp_path, tiny_model_dir, shards)
    earlier = MdsDataModule(config, run_key=config.checkpoint_dir)  # another attempt's folder
    left = Path(earlier.cache_dir, "train", "shard.00000.mds")
    left.parent.mkdir(parents=True)
    left.write_bytes(b"\0" * 1024)
    current = MdsDataModule(config, run_key=config.checkpoint_dir)
    assert Path(current.cache_dir).parent == left.parents[2] != Path(current.cache_dir)
    current.setup("fit")
    assert not left.parents[1].exists() and Path(current.cache_dir).is_dir()
    assert current.remove_earlier_attempts() == []
    current.release()
    current.remove_cache()


def test_rank_0_decides_the_resume_and_a_rank_that_cannot_see_it_fails():
    from finetune_assets.core.training.checkpoints.resume import resume_decision

    assert resume_decision([True, True, True, True]) is True
    assert resume_decision([False, True, False, True]) is False  # rank 0 starts fresh: all do
    with pytest.raises(FileNotFoundError, match=r"ranks \[2, 3\] cannot see it"):
        resume_decision([True, True, False, False])


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_a_nonfinite_loss_stops_the_run_naming_where_or_is_skipped_and_counted(
    tmp_path, tiny_model_dir, shards, monkeypatch, mode
):
    """The loss of batch 2 (step 2) is NaN. ``stop``: the run fails naming step and batch (found
    at the next log interval, no per-step sync). ``skip``: that step is dropped and counted, and
    the trained weights stay finite.
    """
    from safetensors.torch import load_file

    from finetune_assets.core.training.module import NonFiniteLoss

    loss = ReviewClassifier.train_loss

    def nan_at_batch_2(self, logits, labels):
        value = loss(self, logits, labels)
        return value * float("nan") if self.trainer.fit_loop.epoch_loop.batch_idx == 2 else value

    monkeypatch.setattr(ReviewClassifier, "train_loss", nan_at_batch_2)
    config = trainer_config(tmp_path, tiny_model_dir, shards, nonfinite_loss=mode)
    if mode == "stop":
        with pytest.raises(NonFiniteLoss, match="at step 2, batch 2 of epoch 0"):
            train(config)
        return
    metrics = train(config)
    # Lightning counts the dropped step too (the LR schedule stays aligned); no update applied
    assert metrics["nonfinite_skipped"] == 1 and metrics["global_step"] == 6
    weights = load_file(tmp_path / "out" / "model" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
