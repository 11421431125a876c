"""The three review classes, in the order of the seed data set ``arbml/arabic_100k_reviews``."""

from __future__ import annotations

LABELS: tuple[str, ...] = ("Positive", "Negative", "Mixed")
LABEL2ID: dict[str, int] = {name: i for i, name in enumerate(LABELS)}
ID2LABEL: dict[int, str] = dict(enumerate(LABELS))

# Numeric polarity as found in the public Arabic review files (and many others): 1 / -1 / 0.
DEFAULT_LABEL_MAPPING: dict[str, str] = {
    "1": "Positive",
    "-1": "Negative",
    "0": "Mixed",
    "positive": "Positive",
    "negative": "Negative",
    "mixed": "Mixed",
    "neutral": "Mixed",
}
