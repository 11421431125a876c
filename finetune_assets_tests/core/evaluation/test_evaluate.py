"""One macro-F1 outside the trainer, and it agrees with the trainer's torchmetrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchmetrics.classification import MulticlassF1Score

from finetune_assets.core.evaluation.evaluate import LabelSetMismatch, macro_f1, scores
from finetune_assets.core.training.module import _eval_metrics


@pytest.mark.parametrize("num_classes,present", [(2, 2), (3, 2), (5, 3), (5, 5)])
def test_macro_f1_agrees_with_the_trainers_torchmetrics(num_classes: int, present: int):
    """Same predictions, same number: including classes absent from both truth and predictions."""
    rng = np.random.default_rng(num_classes * 10 + present)
    t, p = rng.integers(0, present, 300), rng.integers(0, present, 300)
    metrics = _eval_metrics("test/", num_classes)
    metrics.update(torch.from_numpy(p), torch.from_numpy(t))
    computed = metrics.compute()
    assert macro_f1(t, p) == pytest.approx(float(computed["test/macro_f1"]), abs=1e-6)
    labels = [f"c{i}" for i in range(num_classes)]
    result = scores([labels[i] for i in t], [labels[i] for i in p], labels)
    assert result["macro_f1"] == pytest.approx(float(computed["test/macro_f1"]), abs=1e-6)
    per_class = computed["test/f1_per_class"].tolist()
    assert list(result["f1_per_class"].values()) == pytest.approx(per_class, abs=1e-6)
    assert result["confusion_matrix"] == computed["test/confusion_matrix"].tolist()


def test_a_class_never_seen_is_left_out_of_the_mean_but_listed_at_zero():
    result = scores(["a", "a", "b"], ["a", "b", "b"], ["a", "b", "c"])
    assert result["f1_per_class"]["c"] == 0.0
    assert result["macro_f1"] == pytest.approx(np.mean([2 / 3, 2 / 3]))
    assert float(
        MulticlassF1Score(3, average="macro")(torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1]))
    ) == (pytest.approx(result["macro_f1"]))


def test_labels_outside_the_set_are_refused_by_name():
    with pytest.raises(LabelSetMismatch, match="'z'"):
        scores(["a"], ["z"], ["a", "b"])
