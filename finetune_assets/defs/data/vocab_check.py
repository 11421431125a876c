"""``tokenized_reviews`` check ``vocabulary_fit``: does the base model's vocabulary cover this
data's language?

A warning, never blocking: training still runs, but the UI says why a model may learn little and
what to do. Measures (``finetune_assets.core.evaluation.vocab_fit``) on a spread sample of the
version's
reviews with the published ``pretrained_model`` tokenizer; the truncated share comes from
``tokenized_reviews``' own statistics.
"""

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from finetune_assets.core.evaluation.vocab_fit import FitLimits, advice, measure
from finetune_assets.core.io.contracts import (
    PRETRAINED_MODEL,
    RAW_REVIEWS,
    REVIEWS_FILE,
    TOKENIZED_REVIEWS,
    _fs_and_path,
    iter_parquet_batches,
    read_token_stats,
)
from finetune_assets.defs.common import version_check, version_of
from finetune_assets.defs.resources.storage_root import StorageResource


class VocabularyFitConfig(dg.Config):
    max_unknown_rate: float = Field(0.01, description="largest share of [UNK] tokens")
    max_tokens_per_word: float = Field(
        2.0, description="most word pieces per word (words of >= 2 characters)"
    )
    max_single_char_share: float = Field(
        0.2, description="largest share of words split into single characters"
    )
    max_truncated_share: float = Field(
        0.05, description="largest share of reviews cut at max_length"
    )
    sample_reviews: int = Field(2000, description="reviews measured (spread over the version)")


@version_check(
    asset=TOKENIZED_REVIEWS,
    name="vocabulary_fit",
    blocking=False,
    additional_deps=[RAW_REVIEWS, PRETRAINED_MODEL],
    description="The base model's tokenizer covers the reviews' language: unknown tokens, tokens "
    "per word, words split into single characters, truncated reviews (warning).",
)
def vocabulary_fit(
    context: dg.AssetCheckExecutionContext, config: VocabularyFitConfig, storage: StorageResource
) -> dg.AssetCheckResult:
    """Warns when the base model sees this data as characters or unknown tokens, and says which
    setting fixes it.
    """
    # transformers only here, when the check runs: loading the code location never imports it
    # (finetune_assets_tests/test_layers.py), and every step process loads it.
    from transformers import AutoTokenizer

    version = version_of(context)
    store = storage.storage()
    raw = store.require(RAW_REVIEWS, version)
    tokens = store.require(TOKENIZED_REVIEWS, version)
    model = store.require(PRETRAINED_MODEL)
    texts = _sampled_texts(f"{raw.url}/{REVIEWS_FILE}", store.fs, config.sample_reviews)
    truncated = float(read_token_stats(tokens.url, store.fs).lengths.get("truncated_share", 0.0))
    with store.local_copy(model.url) as model_dir:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, use_fast=True, trust_remote_code=False)
    fit = measure(texts, tokenizer, truncated_share=truncated, limit=config.sample_reviews)
    limits = FitLimits(
        config.max_unknown_rate,
        config.max_tokens_per_word,
        config.max_single_char_share,
        config.max_truncated_share,
    )
    problems = limits.problems(fit)
    todo = advice(problems, fit)
    description = (
        f"the base model's vocabulary does not fit this data: {'; '.join(problems)}. To fix: {todo}"
        if problems
        else f"vocabulary fits: {fit.tokens_per_word:.2f} tokens per word, "
        f"{fit.single_char_share:.1%} single-character words, {fit.unknown_rate:.2%} unknown"
    )
    if problems:
        context.log.warning(description)
    return dg.AssetCheckResult(
        passed=not problems,
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata={
            "unknown_rate": dg.MetadataValue.float(fit.unknown_rate),
            "tokens_per_word": dg.MetadataValue.float(fit.tokens_per_word),
            "single_char_share": dg.MetadataValue.float(fit.single_char_share),
            "truncated_share": dg.MetadataValue.float(fit.truncated_share),
            "reviews_measured": fit.reviews,
            "words_measured": fit.words,
            "limits": dg.MetadataValue.json(limits.__dict__),
            "base_model": dg.MetadataValue.path(model.url),
            "fix": todo,
        },
    )


def _sampled_texts(url: str, fs, limit: int) -> list[str]:
    """``data.vocab_fit.sample_texts`` of the accepted reviews (every k-th), read a record batch at
    a time: the check holds the sample, never the version's whole text column.
    """
    fs_, path = _fs_and_path(url, fs)
    with fs_.open(path, "rb") as f:
        rows = pq.ParquetFile(f).metadata.num_rows
    step = rows / limit if rows > limit else 1.0
    wanted = [int(i * step) for i in range(min(rows, limit))]
    out, offset, at = [], 0, 0
    for batch in iter_parquet_batches(url, fs, columns=["text"]):
        end = offset + batch.num_rows
        picks = []
        while at < len(wanted) and wanted[at] < end:
            picks.append(wanted[at] - offset)
            at += 1
        if picks:
            out += batch.column("text").take(pa.array(picks)).to_pylist()
        offset = end
    return out
