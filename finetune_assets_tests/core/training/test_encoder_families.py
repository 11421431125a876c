"""Every encoder family: loaded with its own class, tokenized with its own special tokens, trained,
exported with identical logits, loaded by ``transformers.pipeline`` and used by ``predict``.

Tiny random models with tokenizers trained in the test (``encoder_families.py``), on real review
text.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.labels.infer import LabelSet
from finetune_assets.core.prep.pretrained import (
    WeightsMismatch,
    load_sequence_classifier,
    position_limit,
    tokenization_of,
)
from finetune_assets.core.prep.validate import SplitRule
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.hyperparameters import HyperParameters
from finetune_assets.core.training.module import (
    ReviewClassifier,
    export_classifier,
    load_classifier,
)
from finetune_assets_tests.core.training.encoder_families import (
    CLASSES,
    FAMILIES,
    XLMR_VOCAB,
    build_family,
)
from finetune_assets_tests.data_path import prepare, tokenize

REPO = Path(__file__).resolve().parents[3]
LABELS = LabelSet(("Negative", "Positive"), {"0": "Negative", "1": "Positive"})
THREE = LabelSet(("Negative", "Mixed", "Positive"))


def _reviews() -> list[tuple[str, str]]:
    """Binary English reviews (the project's generator): tokenizers are trained on them, tiny
    models learn them.
    """
    from finetune_assets.core.sources.sample import make_sample_reviews

    table = make_sample_reviews(600, seed=3)
    return [
        (t, y)
        for t, y in zip(table.column("text").to_pylist(), table.column("label").to_pylist())
        if y in LABELS.names
    ]


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    """One tiny model folder per family, built once per session (copy before changing one)."""
    root = tmp_path_factory.mktemp("families")
    corpus = [t for t, _ in _reviews()]
    return {f: build_family(f, root / f, corpus) for f in FAMILIES}


def _batch(model_dir: Path, texts: list[str]) -> dict[str, torch.Tensor]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return dict(tok(texts, padding=True, truncation=True, max_length=32, return_tensors="pt"))


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_own_class_no_missing_weights_identical_logits(family, family_dirs, tmp_path):
    from transformers import AutoModelForSequenceClassification

    # a new 3-class head on the 2-class checkpoint
    model = load_classifier(str(family_dirs[family]), THREE)
    assert type(model).__name__ == CLASSES[family]
    assert model.config.id2label == {0: "Negative", 1: "Mixed", 2: "Positive"}
    module = ReviewClassifier(model, HyperParameters()).eval()
    # train a little so the export cannot pass by re-reading the pretrained weights
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    batch = _batch(family_dirs[family], ["Great phone, works perfectly!", "Dont waste your money."])
    with torch.no_grad():
        expected = module.model(**batch).logits

    exported = export_classifier(module.model.config, module.state_dict())
    exported.save_pretrained(tmp_path / "out", safe_serialization=True)
    loaded, info = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "out", output_loading_info=True
    )
    assert type(loaded).__name__ == CLASSES[family]
    assert (
        info["missing_keys"] == []
        and info["unexpected_keys"] == []
        and info["mismatched_keys"] == []
    )
    assert loaded.config.id2label == {0: "Negative", 1: "Mixed", 2: "Positive"}
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**batch).logits, expected, rtol=0, atol=1e-6)


def test_a_class_that_does_not_match_the_checkpoint_fails_loudly(family_dirs, tmp_path):
    """XLM-RoBERTa weights under a BERT config (what a hard-coded BERT class does): every encoder
    weight is missing. Without output_loading_info this trains a randomly initialised encoder with a
    warning.
    """
    folder = tmp_path / "xlmr-as-bert"
    shutil.copytree(family_dirs["xlm-roberta"], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="bert", architectures=["BertForSequenceClassification"])
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsMismatch, match=r"missing: \['bert\.embeddings"):
        load_sequence_classifier(str(folder), LABELS)


def test_a_checkpoint_without_an_encoder_weight_fails_loudly(family_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "deberta-missing"
    shutil.copytree(family_dirs["deberta-v2"], folder)
    weights = load_file(folder / "model.safetensors")
    dropped = next(k for k in weights if k.startswith("deberta.encoder.layer.1."))
    del weights[dropped]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightsMismatch, match=dropped.replace(".", r"\.")):
        load_sequence_classifier(str(folder), LABELS)


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenize_keeps_the_models_special_tokens_within_its_position_limit(
    family, family_dirs, tmp_path
):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(family_dirs[family])
    config = AutoConfig.from_pretrained(family_dirs[family])
    limit = position_limit(config)
    assert limit == {"roberta": 64, "xlm-roberta": 128}.get(family, config.max_position_embeddings)
    long = " ".join(t for t, _ in _reviews()[:40])  # hundreds of tokens
    accepted = pa.table(
        {"text": [long, "Great phone!"], "label": ["Positive", "Positive"], "split": ["train"] * 2}
    )
    table = tokenize(accepted, family_dirs[family], tmp_path, limit, labels=LABELS).table()
    ids = table.column("input_ids").to_pylist()
    first, last = tok("x")["input_ids"][0], tok("x")["input_ids"][-1]  # <s>/</s> or [CLS]/[SEP]
    assert len(ids[0]) == limit and table.column("full_length").to_pylist()[0] > limit
    assert ids[0][0] == first and ids[0][-1] == last and ids[1][0] == first and ids[1][-1] == last
    # HF's own truncation
    assert ids == tok([long, "Great phone!"], truncation=True, max_length=limit)["input_ids"]
    facts = tokenization_of(tok, config)  # what pretrained_model publishes for tokenized_reviews
    assert facts.max_input_tokens == min(limit, tok.model_max_length) and facts.vocab_size == len(
        tok
    )
    vocab = len(tok)  # the narrowest unsigned type that holds every id (XLM-R's 70k needs 32 bits)
    expected_dtype = pa.uint8() if vocab <= 2**8 else pa.uint16() if vocab <= 2**16 else pa.uint32()
    assert table.column("input_ids").type.value_type == expected_dtype
    if family == "xlm-roberta":
        assert len(tok) == XLMR_VOCAB
    model = AutoModelForSequenceClassification.from_pretrained(family_dirs[family]).eval()
    with torch.no_grad():  # the longest stored sequence fits the position table
        model(input_ids=torch.tensor([ids[0]], dtype=torch.long))


def _shards(model_dir: Path, root: Path) -> Path:
    """``{root}/shards/{split}``: the reviews through tokenized_reviews and mds_shards, with the
    model's own tokenizer (64 tokens at most).
    """
    rows = _reviews()
    texts = [t for t, _ in rows]
    accepted = pa.table(
        {"text": texts, "label": [lab for _, lab in rows], "split": SplitRule().assign(texts)}
    )
    prepare(accepted, model_dir, root, 64, labels=LABELS)
    return root / "shards"


@pytest.fixture(scope="session")
def mlflow_root(tmp_path_factory) -> Path:
    """One tracking store for the session: creating an SQLite store costs seconds per run."""
    return tmp_path_factory.mktemp("mlflow")


def _config(
    root: Path, model_dir: Path, shards: Path, mlflow_root: Path | None = None, **overrides
) -> dict:
    mlflow_root = mlflow_root or root
    cfg = {
        "model_dir": str(model_dir),
        "output_dir": str(root / "out"),
        "checkpoint_dir": str(root / "ckpt"),
        "accelerator": "cpu",
        "epochs": 1,
        "limit_train_batches": 4,
        "limit_val_batches": 2,
        "log_every_n_steps": 2,
        "labels": list(LABELS.names),
        "class_weights": "balanced",
        "lr": 1e-3,
        "warmup_ratio": 0.0,
        "batch_size": 8,
        "max_length": 64,
        "data": {
            "train_url": str(shards / "train"),
            "train_label_counts": read_split_stats(str(shards / "train")).counts(len(LABELS.names)),
            "validation_url": str(shards / "validation"),
            "test_url": str(shards / "test"),
        },
        "mlflow": {
            "tracking_uri": f"sqlite:///{mlflow_root}/mlflow.db",
            "artifact_location": str(mlflow_root / "mlartifacts"),
            "log_model": False,
        },
    }
    cfg.update(overrides)
    return cfg


def _check_trained_model(out: Path, family: str, metrics: dict) -> None:
    """Saved with its own class and the version's names; pipeline and predict return those names."""
    import transformers

    from finetune_assets.core.evaluation.inference import Classifier

    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == [
        CLASSES[family]
    ]
    assert metrics["labels"] == ["Negative", "Positive"]
    assert set(metrics["f1_per_class"]) == {"Negative", "Positive"}
    assert (
        len(metrics["confusion_matrix"]) == 2
        and sum(map(sum, metrics["confusion_matrix"])) == metrics["test_samples"]
    )
    pipe = transformers.pipeline("text-classification", model=str(out / "model"), device=-1)
    assert {r["label"] for r in pipe(["Great phone!", "Waste of money."])} <= {
        "Negative",
        "Positive",
    }
    classifier = Classifier.from_folder(out / "model")
    # capped at the position limit
    [(label, score, scores)] = classifier.predict(["Works great!"], max_length=512)
    assert label in ("Negative", "Positive") and set(scores) == {"Negative", "Positive"}


@pytest.mark.parametrize("family", FAMILIES)  # a few seconds each (one tracking store for all)
def test_family_trains_in_process_saves_and_predicts(
    family, family_dirs, tmp_path, monkeypatch, mlflow_root
):
    from finetune_assets.core.training.run import train

    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    shards = _shards(family_dirs[family], tmp_path / "data")
    metrics = train(
        TrainerConfig.from_dict(_config(tmp_path, family_dirs[family], shards, mlflow_root))
    )
    assert len(metrics["class_weights"]) == 2
    _check_trained_model(tmp_path / "out", family, metrics)


@pytest.mark.slow
def test_xlm_roberta_under_torchrun_registers_a_pipeline_in_mlflow(family_dirs, tmp_path):
    """The most different family (Unigram, ``</s>`` separator, 32-bit ids, offset positions) through
    ``torchrun --nproc-per-node 2`` with the MLflow transformers flavor, as ``finetuned_model`` runs
    it.
    """
    from finetune_assets.core.launchers.base import torchrun_command

    shards = _shards(family_dirs["xlm-roberta"], tmp_path / "data")
    cfg = _config(
        tmp_path,
        family_dirs["xlm-roberta"],
        shards,
        mlflow={
            "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
            "artifact_location": str(tmp_path / "mlartifacts"),
            "registered_model_name": "review-classifier-negative-positive",
            "log_model": True,
        },
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = torchrun_command(str(tmp_path / "config.json"), nproc_per_node=2, python=sys.executable)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    _check_trained_model(tmp_path / "out", "xlm-roberta", metrics)
    assert metrics["world_size"] == 2
    assert metrics["mlflow"]["registered_model_name"] == "review-classifier-negative-positive"
    assert np.isfinite(metrics["macro_f1"])
