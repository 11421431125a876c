"""The identity of a review's text: what duplicate detection, emptiness and the split are decided
on.

:func:`normalize_text` (invisible code points removed, NFKC, case-folded, whitespace collapsed) is a
review's identity; :func:`text_key` hashes it for the duplicate index; :func:`split_key` is coarser
(letters and digits only), so near-duplicates share a split (:class:`SplitRule`).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass

import pyarrow as pa

from finetune_assets.core.io.contracts import SPLITS

# Code points removed before validation and duplicate detection (documented in docs/reliability.md):
# format characters (Unicode category Cf: zero-width space/joiners, LRM/RLM, bidi embeddings and
# isolates, word joiner, BOM, soft hyphen, Arabic letter mark ...), control characters other than
# whitespace (Cc), variation selectors, and the blank fillers U+115F, U+1160, U+3164, U+FFA0,
# U+2800.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f"  # Cc that is not whitespace
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"  # Cf (Unicode 14)
    "\u034f\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0"  # blank fillers, grapheme joiner
    "\ufe00-\ufe0f\U000e0100-\U000e01ef]"  # variation selectors
)


# Cells that spreadsheets, pandas, R and database dumps write for "no value" (pyarrow's list, plus
# \\N): a review that is only one of these is empty, not a review.
NULL_MARKERS = frozenset(
    {
        "#N/A",
        "#N/A N/A",
        "#NA",
        "-1.#IND",
        "-1.#QNAN",
        "-NaN",
        "-nan",
        "1.#IND",
        "1.#QNAN",
        "N/A",
        "NA",
        "NULL",
        "NaN",
        "n/a",
        "nan",
        "null",
        "None",
        "\\N",
    }
)


def normalize_text(text: str) -> str:
    """The identity of a review: invisible code points removed, NFKC, case-folded, whitespace
    collapsed.

    Used for emptiness, duplicate detection and split assignment, so a review prefixed with a
    right-to-left mark is the same review (same split) as the plain one.
    """
    return " ".join(unicodedata.normalize("NFKC", _INVISIBLE.sub("", text)).casefold().split())


_NON_WORD = re.compile(r"[\W_]+")


def split_key(normalized: str) -> str:
    """Coarser than duplicate detection: everything but letters and digits removed (punctuation,
    spacing, symbols, combining marks), so ``Great, phone!`` and ``great phone`` share a split
    though both are kept; a review without letters or digits keeps its text.
    """
    return _NON_WORD.sub("", normalized) or normalized


def text_key(normalized: str) -> bytes:
    """The duplicate-detection identity of a review: a 16-byte hash of its normalized text (never
    the text).
    """
    return hashlib.blake2b(normalized.encode(), digest_size=16).digest()


@dataclass(frozen=True)
class SplitRule:
    """Fractions of the hash space; a review's split depends only on its normalized text."""

    validation: float = 0.1
    test: float = 0.1
    salt: str = "finetune_assets/v1"

    def __post_init__(self):
        if not (
            0 <= self.validation < 1 and 0 <= self.test < 1 and self.validation + self.test < 1
        ):
            raise ValueError(
                "validation and test fractions must be in [0, 1) and sum to less than 1"
            )

    def of_key(self, key: str) -> str:
        """The split of a review whose :func:`normalize_text` is ``key``, decided on its
        :func:`split_key`: near-duplicates (punctuation, spacing) never straddle splits.
        """
        digest = hashlib.blake2b(
            f"{self.salt}\x00{split_key(key)}".encode(), digest_size=8
        ).digest()
        u = int.from_bytes(digest, "big") / 2**64
        return (
            "test"
            if u < self.test
            else "validation"
            if u < self.test + self.validation
            else "train"
        )

    def split_of_text(self, text: str) -> str:
        return self.of_key(normalize_text(text))

    def assign(self, texts: list[str]) -> list[str]:
        return [self.of_key(normalize_text(t)) for t in texts]


def split_column(accepted: pa.Table) -> pa.Array:
    """The ``split`` column raw_reviews stored (dictionary-encoded); a table without one is an
    error.
    """
    if "split" not in accepted.column_names:
        raise ValueError(
            "the reviews have no 'split' column: they must come from raw_reviews (data.validate), "
            "which assigns each review its split; re-materialize raw_reviews"
        )
    column = accepted.column("split").combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.cast(pa.string())
    unknown = set(column.unique().to_pylist()) - set(SPLITS)
    if unknown:
        raise ValueError(f"split column holds {sorted(map(str, unknown))}, not only {list(SPLITS)}")
    return column.dictionary_encode()
