"""How well a base model's tokenizer covers a data set's language, measured on a sample of its
reviews.

A model whose vocabulary does not cover the language sees text as unknown tokens or as single
characters (the offline English MiniLM on Arabic reviews: most words become letter sequences), and
fine-tuning then learns little that a character n-gram baseline does not do better. Measured per
pre-tokenized word (the tokenizer's own word split) of at least two characters. No Dagster here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

CONTINUATION_MARKS = ("##", "\u2581", "\u0120")  # WordPiece, SentencePiece, byte-level BPE


@dataclass(frozen=True)
class VocabFit:
    reviews: int
    words: int  # pre-tokenized words of >= 2 characters in the sample
    tokens: int  # non-special tokens in the sample
    unknown_rate: float  # share of tokens that are the unknown token
    tokens_per_word: float  # pieces per word (1.0: every word is in the vocabulary)
    single_char_share: float  # share of words split entirely into one-character pieces
    truncated_share: float  # share of reviews longer than max_length (from the whole data set)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class FitLimits:
    max_unknown_rate: float = 0.01
    max_tokens_per_word: float = 2.0
    max_single_char_share: float = 0.2
    max_truncated_share: float = 0.05

    def problems(self, fit: VocabFit) -> list[str]:
        out = []
        if fit.unknown_rate > self.max_unknown_rate:
            out.append(
                f"{fit.unknown_rate:.1%} of tokens are unknown (limit {self.max_unknown_rate:.1%})"
            )
        if fit.tokens_per_word > self.max_tokens_per_word:
            out.append(
                f"{fit.tokens_per_word:.2f} tokens per word (limit {self.max_tokens_per_word:.2f})"
            )
        if fit.single_char_share > self.max_single_char_share:
            out.append(
                f"{fit.single_char_share:.1%} of words are split into single characters "
                f"(limit {self.max_single_char_share:.1%})"
            )
        if fit.truncated_share > self.max_truncated_share:
            out.append(
                f"{fit.truncated_share:.1%} of reviews are truncated (limit "
                f"{self.max_truncated_share:.1%})"
            )
        return out


def advice(problems: list[str], fit: VocabFit) -> str:
    """What to do about the problems found (empty when none)."""
    if not problems:
        return ""
    steps = []
    if fit.unknown_rate > 0 or fit.single_char_share > 0 or fit.tokens_per_word > 1:
        vocab = [p for p in problems if "truncated" not in p]
        if vocab:
            steps.append(
                "use a base model whose vocabulary covers this language: set pretrained_model "
                "config "
                "`source` to a Hugging Face hub id or a local model folder (e.g. a multilingual or "
                "language-specific BERT), then re-materialize pretrained_model and this version"
            )
    if any("truncated" in p for p in problems):
        steps.append(
            "raise tokenized_reviews config `max_length` (up to the model's limit) or accept "
            "that long "
            "reviews are cut"
        )
    return "; ".join(steps)


def _piece_len(token: str) -> int:
    for mark in CONTINUATION_MARKS:
        if token.startswith(mark):
            token = token[len(mark) :]
            break
    return len(token)


def sample_texts(texts: Sequence[str], limit: int) -> list[str]:
    """Every k-th text, so the sample is spread over the data set and the same on every run."""
    if len(texts) <= limit:
        return list(texts)
    step = len(texts) / limit
    return [texts[int(i * step)] for i in range(limit)]


def measure(
    texts: Sequence[str], tokenizer, truncated_share: float = 0.0, limit: int = 2000
) -> VocabFit:
    """Vocabulary fit of ``tokenizer`` (a fast tokenizer) on up to ``limit`` of ``texts``."""
    sample = sample_texts(texts, limit)
    unk = tokenizer.unk_token_id
    specials = set(tokenizer.all_special_ids)
    tokens = unknown = words = pieces = single = 0
    for enc in tokenizer.backend_tokenizer.encode_batch(sample, add_special_tokens=False):
        per_word: dict[int, list[int]] = {}
        for tok_id, tok, word, (start, end) in zip(enc.ids, enc.tokens, enc.word_ids, enc.offsets):
            if tok_id in specials and tok_id != unk:
                continue
            tokens += 1
            unknown += tok_id == unk
            if word is not None:
                per_word.setdefault(word, [start, end, 0, 0])
                span = per_word[word]
                span[0], span[1] = min(span[0], start), max(span[1], end)
                span[2] += 1
                span[3] += tok_id != unk and _piece_len(tok) <= 1
        for start, end, n, n_single in per_word.values():
            if end - start < 2:
                continue  # punctuation and one-letter words say nothing about the vocabulary
            words += 1
            pieces += n
            single += n > 1 and n_single == n
    return VocabFit(
        reviews=len(sample),
        words=words,
        tokens=tokens,
        unknown_rate=round(unknown / tokens, 4) if tokens else 0.0,
        tokens_per_word=round(pieces / words, 3) if words else 0.0,
        single_char_share=round(single / words, 4) if words else 0.0,
        truncated_share=float(truncated_share),
    )
