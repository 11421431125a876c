"""Metadata pictures: valid small PNGs inlined in Markdown, with the numbers beside them."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest

from finetune_assets.core.evaluation import charts as viz

LABELS = ["Positive", "Negative", "Mixed"]


def inline_png(md: str) -> bytes:
    match = re.search(r"!\[[^\]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", md)
    assert match, "no inline PNG in the Markdown"
    return base64.b64decode(match.group(1))


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_label_distribution():
    md = viz.label_distribution_md({"Positive": 120, "Negative": 60, "Mixed": 20})
    png = inline_png(md)
    assert len(png) < viz.MAX_PNG_BYTES
    assert 200 <= png_size(png)[0] <= 600  # readable in the metadata panel, not a poster
    assert "| Positive | 120 | 60.0% |" in md and "| Mixed | 20 | 10.0% |" in md


def test_token_length_histogram_marks_truncation():
    lengths = np.random.default_rng(0).lognormal(4, 0.7, 20_000).astype(int)
    md = viz.token_length_md(lengths, max_length=128)
    assert len(inline_png(md)) < viz.MAX_PNG_BYTES
    share = f"{(lengths > 128).mean():.1%}"
    assert f"| > max_length (128) | {share} |" in md
    assert f"| p50 | {int(np.percentile(lengths, 50))} |" in md


def test_token_length_histogram_of_nothing():
    md = viz.token_length_md([], max_length=64)
    inline_png(md)
    assert "| reviews | 0 |" in md


def test_confusion_matrix():
    matrix = [[50, 5, 3], [4, 40, 6], [0, 0, 0]]  # an empty true class must not divide by zero
    md = viz.confusion_matrix_md(matrix, LABELS)
    assert len(inline_png(md)) < viz.MAX_PNG_BYTES
    assert "| **Negative** | 4 | 40 | 6 |" in md


def test_confusion_matrix_shape_is_checked():
    with pytest.raises(ValueError, match="3x3"):
        viz.confusion_matrix_md([[1, 2], [3, 4]], LABELS)


def test_dagster_renders_it_as_markdown():
    import dagster as dg

    value = dg.MetadataValue.md(viz.label_distribution_md({"Positive": 1}))
    assert isinstance(value, dg.MarkdownMetadataValue)


def test_optimization_history_and_parameter_importance():
    trials = [
        {"number": 0, "state": "COMPLETE", "value": 0.71},
        {"number": 1, "state": "PRUNED", "value": 0.4},
        {"number": 2, "state": "FAIL", "value": None},
        {"number": 3, "state": "COMPLETE", "value": 0.8},
    ]
    md = viz.optimization_history_md(trials)
    assert len(inline_png(md)) < viz.MAX_PNG_BYTES
    assert "| 1 | pruned | 0.4000 |" in md and "| 2 | fail |  |" in md
    md = viz.param_importance_md({"lr": 0.7, "batch_size": 0.3})
    assert len(inline_png(md)) < viz.MAX_PNG_BYTES and "| lr | 0.700 |" in md
