"""The baseline, its decision rule and the shared scores, on real reviews (the shared Arabic
PROD.csv; no Dagster).
"""

import pytest

from finetune_assets.core.evaluation.baseline import BaselineModel, beats_baseline
from finetune_assets.core.evaluation.evaluate import LabelSetMismatch, majority_scores, map_labels
from finetune_assets.core.labels.infer import LABELS
from finetune_assets.core.prep.validate import SplitRule, ValidationRules, validate
from finetune_assets.core.sources import SourceSpec, read_source


@pytest.fixture(scope="module")
def real_split(arabic_reviews):
    """PROD.csv's 4,262 accepted reviews (73 % Positive), split by the project's hash rule; the
    fit takes seconds.
    """
    accepted = validate(
        read_source(SourceSpec(uri=str(arabic_reviews / "PROD.csv"))), ValidationRules()
    ).accepted
    texts, labels = accepted.column("text").to_pylist(), accepted.column("label").to_pylist()
    split = SplitRule().assign(texts)
    return {
        s: (
            [t for t, p in zip(texts, split) if p == s],
            [y for y, p in zip(labels, split) if p == s],
        )
        for s in ("train", "test")
    }


def test_baseline_beats_majority_on_real_reviews_and_survives_save_load(real_split, tmp_path):
    train, test = real_split["train"], real_split["test"]
    model = BaselineModel.fit(*train, label_set=LABELS)
    result = model.evaluate(*test)
    majority = majority_scores(train[1], test[1], model.labels)
    assert result["macro_f1"] > majority["macro_f1"] + 0.15
    assert result["accuracy"] > majority["accuracy"]
    model.save(tmp_path / "b", {"note": "x"})
    loaded = BaselineModel.load(tmp_path / "b")
    assert loaded.labels == list(LABELS)
    assert loaded.predict_labels(test[0][:50]) == model.predict_labels(test[0][:50])
    label, score, by_label = loaded.predict(["ممتاز جدا"])[0]  # "very excellent"
    assert (
        label == "Positive"
        and score == by_label["Positive"]
        and sum(by_label.values()) == pytest.approx(1)
    )


def test_baseline_refuses_a_single_class_and_a_foreign_file(tmp_path):
    with pytest.raises(ValueError, match="at least two classes"):
        BaselineModel.fit(["a b", "c d"], ["Positive", "Positive"])
    with pytest.raises(FileNotFoundError, match="not a baseline_model folder"):
        BaselineModel.load(tmp_path)


def test_beats_baseline_needs_the_margin():
    assert beats_baseline(
        {"macro_f1": 0.6}, {"macro_f1": 0.6}, 0.0
    ).passed  # a tie passes at margin 0
    d = beats_baseline({"macro_f1": 0.62}, {"macro_f1": 0.6}, 0.05)
    assert not d.passed and (d.challenger_macro_f1, d.baseline_macro_f1, d.margin) == (
        0.62,
        0.6,
        0.05,
    )
    assert "0.6200" in d.reason and "0.6500" in d.reason and "does not beat" in d.reason
    # the Arabic numbers of the baseline benchmark
    assert beats_baseline({"macro_f1": 0.449}, {"macro_f1": 0.581}).passed is False


def test_label_mapping_refuses_labels_the_model_cannot_predict():
    assert map_labels(["1", "-1", "0", "Mixed", "1.0"], None, LABELS, "f") == [
        "Positive",
        "Negative",
        "Mixed",
        "Mixed",
        "Positive",
    ]
    assert map_labels(["pos", "neg"], {"pos": "Positive", "neg": "Negative"}, LABELS, "f") == [
        "Positive",
        "Negative",
    ]
    with pytest.raises(LabelSetMismatch, match=r"'spam' \(2 rows\).*--label-mapping"):
        map_labels(["spam", "Positive", "spam"], None, LABELS, "f.csv")
    # a binary model cannot be scored on three classes
    with pytest.raises(LabelSetMismatch, match="'Mixed'"):
        map_labels(["Positive", "Mixed"], None, ["Positive", "Negative"], "f.csv")
