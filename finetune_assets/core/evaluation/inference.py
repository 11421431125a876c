"""The one inference path: a saved sequence classifier + its tokenizer, for the CLI (``predict``,
``evaluate``), the quality gate, ``champion_model`` and the benchmark sets.

Kept free of Dagster and MLflow. Each model is run with *its own* tokenizer and labels come back as
the model's class names (``id2label``), so callers compare models across vocabularies and label ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from finetune_assets.core.evaluation.batching import predict_in_length_order
from finetune_assets.core.io.contracts import MODEL_SUBDIR
from finetune_assets.core.prep.pretrained import position_limit


class ModelFolderError(ValueError):
    """A path that holds no loadable classifier (the message says what was expected)."""


def find_model_dirs(root: Path) -> tuple[Path, Path]:
    """(weights folder, tokenizer folder) of a saved model.

    A Hugging Face folder (``save_pretrained``), a published ``finetuned_model`` attempt (its
    ``model/``), or an MLflow transformers artifact (weights and tokenizer in sub-folders).
    """
    if not root.exists():
        raise ModelFolderError(f"model folder {root} does not exist")
    for folder in (root / MODEL_SUBDIR, root):
        if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
            return folder, folder
    configs = [
        p.parent
        for p in root.rglob("config.json")
        if any(p.parent.glob("*.safetensors")) or any(p.parent.glob("pytorch_model*.bin"))
    ]
    tokenizers = [p.parent for p in root.rglob("tokenizer_config.json")]
    if not configs or not tokenizers:
        raise ModelFolderError(
            f"{root} is not a Hugging Face model folder (no config.json + weights + tokenizer); "
            "pass the folder written by save_pretrained"
        )
    return sorted(configs, key=lambda p: len(p.parts))[0], sorted(
        tokenizers, key=lambda p: len(p.parts)
    )[0]


class Classifier:
    """A sequence classifier + tokenizer; labels are the model's class names in id order."""

    def __init__(self, model, tokenizer, source: str):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.source = source
        cfg = model.config
        self.labels = [cfg.id2label.get(i, str(i)) for i in range(cfg.num_labels)]

    @classmethod
    def from_folder(cls, path: Path, source: str | None = None) -> Classifier:
        # lazy, as torch below: importing this module (the CLI's model checks, gate_rules) loads
        # neither; a prediction does
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        model_dir, tok_dir = find_model_dirs(Path(path))
        tokenizer = AutoTokenizer.from_pretrained(
            tok_dir, local_files_only=True, trust_remote_code=False
        )
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, local_files_only=True, trust_remote_code=False
        )
        return cls(model, tokenizer, source or str(model_dir))

    def predict(
        self, texts: Sequence[str], max_length: int = 512
    ) -> list[tuple[str, float, dict[str, float]]]:
        """(label, probability, probabilities by label) per text, as one padded batch."""
        import torch  # lazy: see from_folder

        limit = min(max_length, position_limit(self.model.config))
        enc = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=limit, return_tensors="pt"
        )
        with torch.inference_mode():
            probs = torch.softmax(self.model(**enc).logits.float(), dim=-1)
        out = []
        for row in probs.tolist():
            best = max(range(len(row)), key=row.__getitem__)
            out.append((self.labels[best], row[best], dict(zip(self.labels, row))))
        return out

    def predict_labels(
        self, texts: Sequence[str], max_length: int = 512, batch_size: int = 32
    ) -> list[str]:
        """The predicted class name per text, in input order; batches of similar length (less
        padding).
        """
        results = predict_in_length_order(
            lambda batch: self.predict(batch, max_length), texts, batch_size
        )
        return [label for label, _, _ in results]
