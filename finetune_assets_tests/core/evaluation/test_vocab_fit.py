"""The vocabulary-fit measure flags the offline English model on the shared Arabic data and passes
on English (the project's generated English sample: the fit depends on the language, not on the
reviews being real).
"""

import pytest
from transformers import AutoTokenizer

from finetune_assets.core.evaluation.vocab_fit import FitLimits, advice, measure
from finetune_assets.core.prep.pretrained import packaged_model_dir
from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets.core.sources.sample import make_sample_reviews


@pytest.fixture(scope="module")
def english_tokenizer():
    return AutoTokenizer.from_pretrained(packaged_model_dir())


def test_english_model_fits_english_reviews(english_tokenizer):
    fit = measure(make_sample_reviews(500).column("text").to_pylist(), english_tokenizer, limit=500)
    assert FitLimits().problems(fit) == []
    assert fit.unknown_rate < 0.001 and fit.tokens_per_word < 1.2 and fit.single_char_share < 0.02


def test_english_model_on_arabic_reviews_is_flagged_with_what_to_do(
    english_tokenizer, arabic_reviews
):
    texts = [
        t
        for t in read_source(SourceSpec(uri=str(arabic_reviews / "PROD.csv")))
        .column("text")
        .to_pylist()
        if t
    ]
    fit = measure(texts, english_tokenizer, limit=500)
    problems = FitLimits().problems(fit)
    assert fit.single_char_share > 0.5 and fit.tokens_per_word > 3
    assert any("single characters" in p for p in problems)
    todo = advice(problems, fit)
    assert "pretrained_model" in todo and "hub id" in todo and "local model folder" in todo


def test_truncation_alone_says_raise_max_length(english_tokenizer):
    fit = measure(["a good dress"], english_tokenizer, truncated_share=0.3)
    problems = FitLimits().problems(fit)
    assert problems == ["30.0% of reviews are truncated (limit 5.0%)"]
    assert "max_length" in advice(problems, fit) and "pretrained_model" not in advice(problems, fit)
