"""A tiny BERT classifier built from a config (never downloaded): the model every training test
uses.
"""

from __future__ import annotations

from pathlib import Path

from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET
from finetune_assets.core.prep.pretrained import packaged_model_dir


def build_tiny_bert(out_dir: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """A tiny BertForSequenceClassification with the packaged model's real WordPiece tokenizer
    (tests).
    """
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
        num_labels=DEFAULT_LABEL_SET.num_labels,
        id2label=DEFAULT_LABEL_SET.id2label,
        label2id=DEFAULT_LABEL_SET.label2id,
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
