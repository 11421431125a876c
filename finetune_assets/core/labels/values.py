"""What a raw label value *is*: its normalized key, the sentiment class a known spelling stands for,
or missing.

Every comparison of label values (inference, ``--labels``, ``--label-mapping``, validation,
evaluation) goes through :func:`label_key`, so spellings that people mean as one class are one
class:

1. invisible code points removed (as for review text), Unicode NFKC (composed and decomposed
   accents, full-width digits), case-folded, whitespace collapsed;
2. a number is its value (``1.0`` and ``+1`` are ``1``);
3. a known synonym or abbreviation of a sentiment class (:data:`SYNONYMS`, the table in
   ``docs/reliability.md``) is that class's key (``NEG`` -> ``negative``);
4. otherwise surrounding punctuation and quotes are removed (``positive.``, ``'neg'``, ``«pos»``;
   not brackets), and steps 2 and 3 applied again.

Missing-value markers (:data:`MISSING`: empty, ``N/A``, ``NaN``, ``null``, ``-``, ``?`` ...) are not
values at all: :func:`is_missing` rows are quarantined as ``missing_label`` and never become a
class.
"""

from __future__ import annotations

import re
import unicodedata

# Cells that spreadsheets, pandas, R, SQL dumps and survey tools write for "no value", compared on
# the NFKC, case-folded, whitespace-collapsed value (documented in docs/reliability.md "Labels").
MISSING = frozenset(
    {
        "",
        "-",
        "--",
        "?",
        "??",
        ".",
        "n/a",
        "na",
        "n.a.",
        "nan",
        "-nan",
        "null",
        "none",
        "nil",
        "<na>",
        "#n/a",
        "#n/a n/a",
        "#na",
        "#null!",
        "#value!",
        "-1.#ind",
        "-1.#qnan",
        "1.#ind",
        "1.#qnan",
        "\\n",
        "(blank)",
        "(empty)",
        "missing",
        "undefined",
    }
)

# Known spellings of sentiment classes: spelling -> the class's key. The class names of inferred
# sets are these keys capitalized. Extend it for a dataset with --label-mapping (or label_mapping in
# _labels.json / the raw_reviews config): a mapping entry is looked up after this table.
SYNONYMS: dict[str, str] = {
    **dict.fromkeys(
        ("negative", "neg", "negativ", "negatif", "négatif", "negativo", "-ve", "سلبي", "سلبية"),
        "negative",
    ),
    **dict.fromkeys(
        (
            "positive",
            "pos",
            "positiv",
            "positif",
            "positivo",
            "+ve",
            "إيجابي",
            "ايجابي",
            "إيجابية",
            "ايجابية",
        ),
        "positive",
    ),
    **dict.fromkeys(("neutral", "neu", "neut", "neutre", "neutro", "محايد", "محايدة"), "neutral"),
    **dict.fromkeys(("mixed", "mix"), "mixed"),
    **dict.fromkeys(("very negative", "very neg", "v neg", "strongly negative"), "very negative"),
    **dict.fromkeys(("very positive", "very pos", "v pos", "strongly positive"), "very positive"),
}

_INVISIBLE = re.compile("[\u00ad\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]")


def _is_punct(ch: str) -> bool:
    """Sentence punctuation, quotes and dashes; not brackets (``[1]`` is a list, not the number
    1).
    """
    return unicodedata.category(ch) in ("Po", "Pi", "Pf", "Pd")


def folded(raw: object) -> str:
    """Step 1 only: invisible marks removed, NFKC, case-folded, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", _INVISIBLE.sub("", str(raw)))
    return " ".join(text.casefold().split())


def is_missing(raw: object) -> bool:
    """A missing-value marker (or None): the row has no label, whatever the label set."""
    return raw is None or folded(raw) in MISSING


def _number(key: str) -> str | None:
    try:
        number = float(key)
    except ValueError:
        return None
    if number != number or number in (float("inf"), float("-inf")):
        return None
    if number.is_integer() and abs(number) < 2**53:
        return str(int(number))
    return key


def label_key(raw: object) -> str:
    """The identity of a raw label value (steps in the module docstring)."""
    key = folded(raw)
    number = _number(key)
    if number is not None:
        return number
    if key in SYNONYMS:
        return SYNONYMS[key]
    i, j = 0, len(key)
    while i < j and _is_punct(key[i]) and not (key[i] == "-" and key[i + 1 : i + 2].isdigit()):
        i += 1
    while j > i and _is_punct(key[j - 1]):
        j -= 1
    stripped = key[i:j].strip()
    if not stripped or stripped == key:
        return key
    number = _number(stripped)
    return number if number is not None else SYNONYMS.get(stripped, stripped)


def shown(values) -> list[str]:
    """Values for a message: ``ascii()`` where two spellings would otherwise print alike."""
    return [v if v.isascii() or unicodedata.is_normalized("NFC", v) else ascii(v) for v in values]
