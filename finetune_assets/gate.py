"""Model promotion: score a challenger and the current champion on the same frozen test reviews.

Kept free of Dagster (the asset check is a thin wrapper), so a person can re-run a decision by hand.

"Same test data" means the same *texts and labels*: the test split of a dataset version (fixed by
each review's text hash, so a newer version's test split is a superset of an older one's). Each model
is scored from the raw test texts with *its own* tokenizer, so a champion trained on another base
model (another vocabulary) is still compared fairly. Scores are cached on the MLflow model version as
tags keyed by the test data's hash, so a champion is re-scored only when the test data changed.
"""

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from finetune_assets.data.labels import LABELS

CHAMPION_ALIAS = "champion"
TAG_SCORE = "gate.macro_f1"  # score on the test data named by TAG_TEST_DATA
TAG_TEST_DATA = "gate.test_data"
TAG_DECISION = "gate.decision"


@dataclass(frozen=True)
class TestSet:
    texts: list[str]
    labels: np.ndarray  # label ids in ``names`` order
    fingerprint: str  # hash of (text, label) pairs, order-independent
    names: tuple[str, ...] = LABELS  # the dataset version's classes

    @classmethod
    def build(cls, texts: list[str], labels: list[str], names: tuple[str, ...] = LABELS) -> "TestSet":
        if len(texts) != len(labels):
            raise ValueError(f"test set: {len(texts)} texts but {len(labels)} labels")
        pairs = sorted(zip(texts, labels))
        digest = hashlib.sha256()
        for t, lab in pairs:
            digest.update(t.encode() + b"\x00" + lab.encode() + b"\x01")
        label2id = {n: i for i, n in enumerate(names)}
        return cls([t for t, _ in pairs], np.asarray([label2id[lab] for _, lab in pairs], dtype=np.int64),
                   digest.hexdigest()[:16], tuple(names))


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int = len(LABELS)) -> float:
    """Mean F1 over all classes (a class absent from both truth and predictions scores 0, like torchmetrics)."""
    scores = []
    for c in range(num_classes):
        tp = int(np.sum((y_pred == c) & (y_true == c)))
        fp = int(np.sum((y_pred == c) & (y_true != c)))
        fn = int(np.sum((y_pred != c) & (y_true == c)))
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def majority_baseline(test: TestSet) -> float:
    """Macro-F1 of always predicting the most frequent test class: the floor any model must clear."""
    if len(test.labels) == 0:
        return 0.0
    majority = int(np.bincount(test.labels, minlength=len(test.names)).argmax())
    return macro_f1(test.labels, np.full_like(test.labels, majority), len(test.names))


def find_model_dirs(root: Path) -> tuple[Path, Path]:
    """(weights folder, tokenizer folder) in a saved model: an HF folder or an MLflow transformers artifact."""
    configs = [p.parent for p in root.rglob("config.json") if any(p.parent.glob("*.safetensors"))
               or any(p.parent.glob("pytorch_model*.bin"))]
    tokenizers = [p.parent for p in root.rglob("tokenizer_config.json")]
    if not configs or not tokenizers:
        raise FileNotFoundError(f"{root}: no model weights + config.json, or no tokenizer, found")
    return sorted(configs, key=lambda p: len(p.parts))[0], sorted(tokenizers, key=lambda p: len(p.parts))[0]


def score_model(root: Path, test: TestSet, max_length: int = 512, batch_size: int = 32) -> float:
    """Macro-F1 of a saved classifier on the test texts, tokenized with the model's own tokenizer."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model_dir, tok_dir = find_model_dirs(root)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True, trust_remote_code=False)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True,
                                                               trust_remote_code=False).eval()
    # Map the model's output ids to our label ids by name (a model saved with other ids still scores right).
    id2label = {int(k): v for k, v in (model.config.id2label or {}).items()}
    label2id = {n: i for i, n in enumerate(test.names)}
    unknown = sorted(set(id2label.values()) - set(label2id))
    if unknown:
        raise ValueError(f"{root}: the model predicts {unknown}, not classes of the test data {list(test.names)}")
    remap = np.asarray([label2id[id2label[i]] for i in range(model.config.num_labels)])
    from finetune_assets.data.models import position_limit

    limit = min(max_length, position_limit(model.config))
    order = np.argsort([len(t) for t in test.texts])  # similar lengths per batch: less padding
    preds = np.empty(len(test.texts), dtype=np.int64)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            enc = tokenizer([test.texts[i] for i in idx], padding=True, truncation=True, max_length=limit,
                            return_tensors="pt")
            logits = model(**enc).logits
            preds[idx] = remap[logits.argmax(-1).numpy()]
    return macro_f1(test.labels, preds, len(test.names))


@dataclass(frozen=True)
class Champion:
    version: str
    cached_score: float | None  # its score on this test data, when a previous gate computed it
    dataset_version: str | None
    run_id: str | None


def current_champion(client, name: str, test: TestSet, alias: str = CHAMPION_ALIAS) -> Champion | None:
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None  # no registered model yet, or no version holds the alias
    tags = mv.tags or {}
    cached = float(tags[TAG_SCORE]) if tags.get(TAG_TEST_DATA) == test.fingerprint and TAG_SCORE in tags else None
    return Champion(version=str(mv.version), cached_score=cached, dataset_version=tags.get("dataset_version"),
                    run_id=mv.run_id)


def score_registered(client, name: str, version: str, test: TestSet, tracking_uri: str) -> float:
    """Download a registered model version and score it (then cache the score as a tag on the version)."""
    import mlflow

    # Resolve the version through *this* client's registry: a ``models:/name/version`` URI would be
    # resolved against mlflow's process-global registry URI instead (unset in a Dagster run: ./mlflow.db).
    source = client.get_model_version_download_uri(name, version)
    with tempfile.TemporaryDirectory(prefix="champion-") as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=tmp, tracking_uri=tracking_uri)
        score = score_model(Path(local), test)
    remember_score(client, name, version, test, score)
    return score


def remember_score(client, name: str, version: str, test: TestSet, score: float) -> None:
    client.set_model_version_tag(name, version, TAG_TEST_DATA, test.fingerprint)
    # Full precision: a rounded cache could rank an equally good challenger below the champion.
    client.set_model_version_tag(name, version, TAG_SCORE, repr(float(score)))
