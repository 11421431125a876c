"""One inference class for the CLI, the gate and the benchmark sets: same folder layouts, same
answers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from finetune_assets.core.evaluation import gate_rules as gate
from finetune_assets.core.evaluation.evaluate import macro_f1
from finetune_assets.core.evaluation.inference import Classifier, ModelFolderError

TEXTS = [
    "a",
    "a much longer review that needs more tokens than the others",
    "fine",
    "not good at all",
]


def test_every_published_layout_loads_the_same_model_and_answers_the_same(
    tiny_model_dir: Path, tmp_path: Path
):
    attempt = tmp_path / "attempt"  # a published finetuned_model attempt: model/ inside
    shutil.copytree(tiny_model_dir, attempt / "model")
    # an MLflow transformers artifact: weights and tokenizer apart
    mlflow_like = tmp_path / "artifact"
    shutil.copytree(tiny_model_dir, mlflow_like / "model" / "model")
    (mlflow_like / "model" / "components" / "tokenizer").mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            shutil.move(
                mlflow_like / "model" / "model" / f.name,
                mlflow_like / "model" / "components" / "tokenizer",
            )
    answers = []
    for folder in (tiny_model_dir, attempt, mlflow_like):
        classifier = Classifier.from_folder(folder)
        assert classifier.labels == ["Positive", "Negative", "Mixed"]
        answers.append([label for label, _, _ in classifier.predict(TEXTS)])
        # sorted, batched prediction returns labels in input order, equal to one batch's
        assert classifier.predict_labels(TEXTS, batch_size=3) == answers[-1]
    assert answers[0] == answers[1] == answers[2]


def test_gate_scores_with_the_same_classifier(tiny_model_dir: Path):
    names = ("Positive", "Negative", "Mixed")
    test = gate.TestSet.build(TEXTS, ["Positive", "Negative", "Mixed", "Negative"], names)
    predicted = Classifier.from_folder(tiny_model_dir).predict_labels(test.texts)
    want = macro_f1(test.labels, np.asarray([names.index(p) for p in predicted]))
    assert gate.score_model(tiny_model_dir, test) == pytest.approx(want)


def test_a_folder_without_a_model_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ModelFolderError, match="does not exist"):
        Classifier.from_folder(tmp_path / "missing")
    with pytest.raises(ModelFolderError, match="save_pretrained"):
        Classifier.from_folder(tmp_path)
