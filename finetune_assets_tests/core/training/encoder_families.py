"""Tiny random encoders of every supported family, each with a tokenizer trained here
(``tokenizers``).

What they are: the real transformers classes (``XLMRobertaForSequenceClassification`` ...) with a
few thousand parameters, and fast tokenizers of the family's algorithm and special tokens (WordPiece
with ``[CLS]``/``[SEP]``, byte-level BPE with ``<s>``/``</s>``, Unigram), saved as Hugging Face
folders that ``AutoModel*`` / ``AutoTokenizer`` / ``transformers.pipeline`` load offline. What they
are not: pretrained. Their vocabularies are small, except XLM-RoBERTa's, padded past 65,536 pieces
so token ids need 32 bits as with the real 250k vocabulary; RoBERTa's position table is short (66 =
64 + padding offset) so a too-long ``max_length`` would index past it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

FAMILIES = ("bert", "distilbert", "roberta", "xlm-roberta", "deberta-v2", "modernbert")
CLASSES = {
    "bert": "BertForSequenceClassification",
    "distilbert": "DistilBertForSequenceClassification",
    "roberta": "RobertaForSequenceClassification",
    "xlm-roberta": "XLMRobertaForSequenceClassification",
    "deberta-v2": "DebertaV2ForSequenceClassification",
    "modernbert": "ModernBertForSequenceClassification",
}
XLMR_VOCAB = 70_000  # > 2**16: ids no longer fit uint16
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _wordpiece(corpus: list[str]):
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(
        corpus, trainers.WordPieceTrainer(vocab_size=600, special_tokens=BERT_SPECIALS)
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    tok.decoder = decoders.WordPiece()
    return tok


def _byte_bpe(corpus: list[str], specials: list[str], roberta: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=700,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.decoder = decoders.ByteLevel()
    if roberta:
        tok.post_processor = processors.RobertaProcessing(
            ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>"))
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[
                ("[CLS]", tok.token_to_id("[CLS]")),
                ("[SEP]", tok.token_to_id("[SEP]")),
            ],
        )
    return tok


def _unigram(corpus: list[str], specials: list[str], bos: str, eos: str, pad_to: int | None = None):
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(
        corpus,
        trainers.UnigramTrainer(
            vocab_size=500,
            special_tokens=specials,
            unk_token=specials[specials.index("<unk>") if "<unk>" in specials else 1],
        ),
    )
    if pad_to:  # a big vocabulary, as XLM-R's 250k: learned pieces + rare filler pieces
        vocab = [
            (tok.id_to_token(i), -1.0 if i < len(specials) else -5.0)
            for i in range(tok.get_vocab_size())
        ]
        vocab += [(f"\u2581zz{i}", -20.0) for i in range(pad_to - len(vocab))]
        unk = [p for p, _ in vocab].index("<unk>")
        big = Tokenizer(models.Unigram(vocab, unk_id=unk, byte_fallback=False))
        big.normalizer, big.pre_tokenizer = tok.normalizer, tok.pre_tokenizer
        tok = big
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} $B {eos}",
        special_tokens=[(bos, tok.token_to_id(bos)), (eos, tok.token_to_id(eos))],
    )
    return tok


def build_family(
    family: str, out_dir: Path, corpus: Iterable[str], num_labels: int = 2, seed: int = 0
) -> Path:
    """Save a tiny ``family`` sequence classifier + its trained tokenizer under ``out_dir``."""
    import torch
    import transformers as tf

    corpus = list(corpus)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    labels = dict(num_labels=num_labels)
    if family in ("bert", "distilbert"):
        tok = _wordpiece(corpus)
        fast_cls = tf.BertTokenizerFast if family == "bert" else tf.DistilBertTokenizerFast
        fast = fast_cls(
            tokenizer_object=tok,
            unk_token="[UNK]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            mask_token="[MASK]",
        )
        if family == "bert":
            config = tf.BertConfig(
                vocab_size=len(fast), max_position_embeddings=128, **small, **labels
            )
        else:
            config = tf.DistilBertConfig(
                vocab_size=len(fast),
                dim=32,
                n_layers=2,
                n_heads=2,
                hidden_dim=64,
                max_position_embeddings=128,
                pad_token_id=fast.pad_token_id,
                **labels,
            )
    elif family == "roberta":
        tok = _byte_bpe(corpus, ROBERTA_SPECIALS, roberta=True)
        fast = tf.RobertaTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            sep_token="</s>",
            cls_token="<s>",
            unk_token="<unk>",
            pad_token="<pad>",
            mask_token="<mask>",
        )
        config = tf.RobertaConfig(
            vocab_size=len(fast),
            max_position_embeddings=66,
            pad_token_id=fast.pad_token_id,
            bos_token_id=fast.bos_token_id,
            eos_token_id=fast.eos_token_id,
            type_vocab_size=1,
            **small,
            **labels,
        )
    elif family == "xlm-roberta":
        tok = _unigram(corpus, ROBERTA_SPECIALS, "<s>", "</s>", pad_to=XLMR_VOCAB)
        fast = tf.XLMRobertaTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            sep_token="</s>",
            cls_token="<s>",
            unk_token="<unk>",
            pad_token="<pad>",
            mask_token="<mask>",
        )
        config = tf.XLMRobertaConfig(
            vocab_size=len(fast),
            max_position_embeddings=130,
            pad_token_id=fast.pad_token_id,
            bos_token_id=fast.bos_token_id,
            eos_token_id=fast.eos_token_id,
            type_vocab_size=1,
            **small,
            **labels,
        )
    elif family == "deberta-v2":
        specials = ["[PAD]", "[CLS]", "[SEP]", "<unk>", "[MASK]"]
        tok = _unigram(corpus, specials, "[CLS]", "[SEP]")
        fast = tf.DebertaV2TokenizerFast(
            tokenizer_object=tok,
            bos_token="[CLS]",
            eos_token="[SEP]",
            unk_token="<unk>",
            sep_token="[SEP]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            mask_token="[MASK]",
        )
        # DeBERTa-v3's shape: no token type embeddings, relative attention only.
        config = tf.DebertaV2Config(
            vocab_size=len(fast),
            max_position_embeddings=128,
            type_vocab_size=0,
            relative_attention=True,
            position_buckets=32,
            max_relative_positions=-1,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            pad_token_id=fast.pad_token_id,
            **small,
            **labels,
        )
    elif family == "modernbert":
        tok = _byte_bpe(corpus, BERT_SPECIALS, roberta=False)
        fast = tf.PreTrainedTokenizerFast(
            tokenizer_object=tok,
            unk_token="[UNK]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            mask_token="[MASK]",
            model_input_names=["input_ids", "attention_mask"],
        )
        config = tf.ModernBertConfig(
            vocab_size=len(fast),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=256,
            local_attention=16,
            global_attn_every_n_layers=2,
            pad_token_id=fast.pad_token_id,
            cls_token_id=fast.cls_token_id,
            sep_token_id=fast.sep_token_id,
            bos_token_id=fast.cls_token_id,
            eos_token_id=fast.sep_token_id,
            reference_compile=False,
            **labels,
        )
    else:
        raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")
    torch.manual_seed(seed)
    model = tf.AutoModelForSequenceClassification.from_config(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    # unset, as on many hub tokenizers: the position table must bound lengths
    fast.model_max_length = 10**6
    fast.save_pretrained(out_dir)
    return out_dir
