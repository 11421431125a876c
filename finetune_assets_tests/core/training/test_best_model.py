"""Best-validation selection and early stopping through the real ``train()`` (tiny BERT, real
reviews, real checkpoints and export).

A 48-review tiny model's real validation macro-F1 is noise, so the value each validation reports is
scripted (the one narrow double: what ``self.log`` receives for ``val/macro_f1``); everything else
(Lightning's ModelCheckpoint and EarlyStopping, the checkpoint files, the resume, the Hugging Face
export) is the trainer's own. Each scripted validation snapshots the weights it stands for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from finetune_assets.core.training.module import ReviewClassifier
from finetune_assets.core.training.run import train
from finetune_assets_tests.core.training.fixtures import write_mds_splits
from finetune_assets_tests.core.training.test_train import trainer_config

STEPS_PER_EPOCH = 6  # 48 train reviews, batch 8


@pytest.fixture
def shards(tmp_path, tiny_model_dir, arabic_reviews) -> Path:
    return write_mds_splits(
        tmp_path / "published", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(48, 12, 12)
    )


class Script:
    """Epoch ``e`` (0-based) reports ``values[e]`` as ``val/macro_f1``; ``crash_at``: raise once."""

    def __init__(self, monkeypatch, values: list[float], crash_at: int | None = None):
        self.values, self.crash_at = values, crash_at
        self.weights: dict[int, dict[str, torch.Tensor]] = {}  # 1-based epoch -> HF state dict
        original = ReviewClassifier.on_validation_epoch_end
        script = self

        def scripted(module: ReviewClassifier) -> None:
            epoch = module.current_epoch
            real_log = module.log

            def log(name, value, *args, **kwargs):
                if name == "val/macro_f1":
                    value = script.values[epoch]
                return real_log(name, value, *args, **kwargs)

            module.log = log
            try:
                original(module)
            finally:
                del module.log
            script.weights[epoch + 1] = {
                k: v.detach().float().clone() for k, v in module.model.state_dict().items()
            }
            if script.crash_at == epoch:
                script.crash_at = None
                raise RuntimeError("simulated crash after a validation")

        monkeypatch.setattr(ReviewClassifier, "on_validation_epoch_end", scripted)


def exported(out: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load_file(out / "model" / "model.safetensors").items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    shared = a.keys() & b.keys()
    assert len(shared) > 10  # the encoder and the head, not an empty comparison
    return all(torch.equal(a[k], b[k]) for k in shared)


def test_validation_peaking_at_epoch_2_of_4_exports_epoch_2s_weights(
    tmp_path, tiny_model_dir, shards, monkeypatch
):
    script = Script(monkeypatch, [0.50, 0.90, 0.60, 0.70])
    config = trainer_config(
        tmp_path, tiny_model_dir, shards, epochs=4, early_stopping_patience=None
    )

    metrics = train(config)

    assert metrics["global_step"] == 4 * STEPS_PER_EPOCH  # early stopping off
    model = exported(tmp_path / "out")
    assert same(model, script.weights[2])
    assert not same(model, script.weights[4])  # the weights training ended with differ
    selection = metrics["model_selection"]
    assert selection["selected"] == "best" and not selection["early_stopped"]
    assert (selection["best_epoch"], selection["best_step"]) == (2, 2 * STEPS_PER_EPOCH)
    assert selection["best_value"] == pytest.approx(0.90)
    assert [p["value"] for p in selection["curve"]] == pytest.approx([0.5, 0.9, 0.6, 0.7])
    # the test scores are the exported weights' (the module was switched to them before testing)
    assert metrics["macro_f1"] is not None


def test_select_model_last_exports_the_final_weights(tmp_path, tiny_model_dir, shards, monkeypatch):
    script = Script(monkeypatch, [0.50, 0.90, 0.60])
    config = trainer_config(tmp_path, tiny_model_dir, shards, epochs=3, select_model="last")

    metrics = train(config)

    assert same(exported(tmp_path / "out"), script.weights[3])
    assert metrics["model_selection"]["selected"] == "last"
    assert metrics["model_selection"]["best_epoch"] == 2  # still reported


def test_early_stopping_fires_after_patience_validations_without_improvement(
    tmp_path, tiny_model_dir, shards, monkeypatch
):
    # epoch 4 would have been the best: early stopping never gets there
    script = Script(monkeypatch, [0.50, 0.90, 0.60, 0.95])
    config = trainer_config(tmp_path, tiny_model_dir, shards, epochs=4, early_stopping_patience=1)

    metrics = train(config)

    assert metrics["global_step"] == 3 * STEPS_PER_EPOCH
    assert 4 not in script.weights
    assert same(exported(tmp_path / "out"), script.weights[2])
    selection = metrics["model_selection"]
    assert selection["early_stopped"] and selection["stopped_at_epoch"] == 3
    assert selection["early_stopping_patience"] == 1 and selection["best_epoch"] == 2


def test_a_run_crashed_after_its_best_epoch_resumes_and_still_exports_the_best(
    tmp_path, tiny_model_dir, shards, monkeypatch
):
    # checkpoints every 5 steps: the crash in epoch 3's validation (step 18) resumes from step 15
    script = Script(monkeypatch, [0.50, 0.90, 0.60, 0.70], crash_at=2)
    config = trainer_config(
        tmp_path, tiny_model_dir, shards, epochs=4, early_stopping_patience=None
    )
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(config)
    epoch_2 = script.weights[2]
    assert (tmp_path / "ckpt" / "best" / "best.ckpt").is_file()

    metrics = train(config)

    assert metrics["resumed_at_step"] == 15 and metrics["global_step"] == 4 * STEPS_PER_EPOCH
    assert same(exported(tmp_path / "out"), epoch_2)
    selection = metrics["model_selection"]
    # the points before the checkpoint came back with it; epoch 3's was taken again after it
    assert [p["epoch"] for p in selection["curve"]] == [1, 2, 3, 4]
    assert [p["value"] for p in selection["curve"]] == pytest.approx([0.5, 0.9, 0.6, 0.7])
    assert selection["best_epoch"] == 2
