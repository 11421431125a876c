"""The offline default review set: small, deterministic, English, made by the project itself.

It exists so that the whole graph materializes on a fresh machine with no data hub; real data
comes in as registered dataset versions (files, folders or a Hugging Face dataset id).
"""

from __future__ import annotations

import random

import pyarrow as pa

SAMPLE_SOURCE = "builtin:sample"

_SUBJECTS = [
    "the hotel",
    "this phone",
    "the restaurant",
    "the delivery",
    "the staff",
    "this laptop",
    "the museum",
    "the app",
    "the room",
    "the coffee",
    "the service",
    "this product",
    "the tour",
    "the battery",
    "the food",
    "the checkout",
    "the camera",
    "the beach",
]
_POSITIVE = [
    "was excellent",
    "is wonderful",
    "exceeded my expectations",
    "was perfect",
    "is fantastic",
    "made us very happy",
    "works great",
    "was friendly and helpful",
    "is worth every penny",
    "was amazing",
    "is outstanding",
    "was a real pleasure",
]
_NEGATIVE = [
    "was terrible",
    "is awful",
    "was a waste of money",
    "broke after two days",
    "was rude and slow",
    "is disappointing",
    "was dirty",
    "never worked",
    "is the worst I have seen",
    "was horrible",
    "made me angry",
    "is useless",
]
_OPENERS = ["", "Honestly, ", "To be fair, ", "Overall ", "I think ", "In short, ", "Well, "]
_CLOSERS = ["", " I would recommend it.", " Never again.", " Five stars.", " One star.", ""]


def _sentence(rng: random.Random, polarity: list[str]) -> str:
    return f"{rng.choice(_SUBJECTS)} {rng.choice(polarity)}"


def make_sample_reviews(n: int = 1200, seed: int = 13) -> pa.Table:
    """``n`` reviews with ``text`` and ``label`` (Positive / Negative / Mixed), about 50/30/20."""
    rng = random.Random(seed)
    texts: list[str] = []
    labels: list[str] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            label, body = "Positive", _sentence(rng, _POSITIVE)
            closer = rng.choice(_CLOSERS[:4] + [" Five stars."])
            closer = "" if closer in (" Never again.", " One star.") else closer
        elif r < 0.8:
            label, body = "Negative", _sentence(rng, _NEGATIVE)
            closer = rng.choice(["", " Never again.", " One star."])
        else:
            label = "Mixed"
            body = f"{_sentence(rng, _POSITIVE)}, but {_sentence(rng, _NEGATIVE)}"
            closer = ""
        opener = rng.choice(_OPENERS)
        text = f"{opener}{body}.{closer}"
        texts.append(text[0].upper() + text[1:])
        labels.append(label)
    return pa.table({"text": texts, "label": labels})
