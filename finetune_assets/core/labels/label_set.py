"""A label set: a version's ordered class names and how raw label values map to them.

What every step downstream follows (label ids, the model head's ``id2label``, class weights,
metrics, the registered model's name). How a source's set is inferred or given:
:mod:`finetune_assets.core.labels.infer`.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field

from finetune_assets.core.labels.values import is_missing, label_key, shown

MAX_CLASSES = 127  # label ids are stored as int8

# The default three classes, in the order of ``arbml/arabic_100k_reviews``: the set of numeric
# 1 / -1 / 0 data.
LABELS: tuple[str, ...] = ("Positive", "Negative", "Mixed")
LABEL2ID: dict[str, int] = {name: i for i, name in enumerate(LABELS)}
ID2LABEL: dict[int, str] = dict(enumerate(LABELS))
DEFAULT_LABEL_MAPPING: dict[str, str] = {
    "1": "Positive",
    "-1": "Negative",
    "0": "Mixed",
    "positive": "Positive",
    "negative": "Negative",
    "mixed": "Mixed",
    "neutral": "Mixed",
}

# Known sentiment classes (keys of label_values.SYNONYMS), most negative first; a text label set
# made only of these is ordered by it.
POLARITY_ORDER: tuple[str, ...] = (
    "very negative",
    "negative",
    "mixed",
    "neutral",
    "positive",
    "very positive",
)
STAR_NAMES: tuple[str, ...] = ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")
# The documented one-flag mapping of star ratings to three sentiment classes (README, "Star
# ratings").
STARS_TO_SENTIMENT: dict[str, str] = {
    "1": "Negative",
    "2": "Negative",
    "3": "Neutral",
    "4": "Positive",
    "5": "Positive",
}

LABELS_FLAG = "--labels"
MAPPING_FLAG = "--label-mapping"


class LabelError(ValueError):
    """A label set that cannot be used or inferred; the message names the values and the flag
    that fixes it.
    """


normalize_value = label_key  # the identity of a raw label value (label_values module docstring)


def class_name(raw: str) -> str:
    """A class name as stored and shown: NFC, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFC", str(raw)).split())


@dataclass(frozen=True)
class LabelSet:
    """Ordered class names (id = position) and raw value -> name (keys normalized, see
    :func:`normalize_value`).

    A raw value equal to a class name (case-insensitively) maps to it without a mapping entry.
    """

    names: tuple[str, ...]
    mapping: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = tuple(class_name(n) for n in self.names)
        if len(names) < 2:
            raise LabelError(f"a label set needs at least two classes, got {list(names)}")
        if len(names) > MAX_CLASSES:
            raise LabelError(f"at most {MAX_CLASSES} classes are supported, got {len(names)}")
        if any(not n for n in names):
            raise LabelError(f"class names must not be empty: {list(self.names)}")
        keys = [label_key(n) for n in names]
        dupes = [n for n, k in zip(names, keys) if keys.count(k) > 1]
        if dupes:
            raise LabelError(
                f"ambiguous class names: {shown(dupes)} are one class once case, spacing, "
                f"Unicode form and known synonyms are merged; give {LABELS_FLAG} one name per "
                f"class (and {MAPPING_FLAG} RAW=NAME for spellings that mean another class)"
            )
        by_key = dict(zip(keys, names))
        mapping = {}
        for k, v in self.mapping.items():
            key, target = label_key(k), by_key.get(label_key(v), class_name(v))
            if mapping.get(key, target) != target:
                raise LabelError(
                    f"ambiguous {MAPPING_FLAG}: {k!r} is the same label value as another "
                    f"entry once case, spacing, Unicode form and synonyms are merged, mapped "
                    f"to both {mapping[key]!r} and {target!r}; keep one of them"
                )
            mapping[key] = target
        unknown = sorted({v for v in mapping.values() if v not in names})
        if unknown:
            raise LabelError(
                f"the label mapping maps to {unknown}, which are not among the labels "
                f"{list(names)}; "
                f"add them to {LABELS_FLAG} or fix {MAPPING_FLAG}"
            )
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "mapping", dict(sorted(mapping.items())))

    @property
    def num_labels(self) -> int:
        return len(self.names)

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.names))

    @property
    def label2id(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def map(self, raw: str | None) -> str | None:
        """The class of a raw label value, or None when it is not in the set (the row is
        quarantined).
        """
        if is_missing(raw):
            return None
        key = label_key(raw)
        if key in self.mapping:
            return self.mapping[key]
        for name in self.names:
            if label_key(name) == key:
                return name
        return None

    def with_mapping(self, mapping: Mapping[str, str]) -> LabelSet:
        """The same classes with another raw-value mapping (a per-run override of the mapping
        only).
        """
        return LabelSet(self.names, mapping)

    def to_dict(self) -> dict[str, object]:
        return {"names": list(self.names), "mapping": dict(self.mapping)}

    @classmethod
    def from_dict(cls, obj: Mapping[str, object]) -> LabelSet:
        return cls(tuple(obj["names"]), dict(obj.get("mapping") or {}))  # type: ignore[arg-type]

    def fingerprint(self) -> str:
        """Hash of names (in order) and mapping: part of a version's identity and its data
        version.
        """
        body = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def describe(self) -> str:
        pairs = ", ".join(f"{k}={v}" for k, v in self.mapping.items())
        return f"{', '.join(self.names)}" + (f" (mapping {pairs})" if pairs else "")


DEFAULT_LABEL_SET = LabelSet(LABELS, DEFAULT_LABEL_MAPPING)
# Binary data labelled -1 / 1 only (no 0): negative and positive, in polarity order.
BINARY_LABEL_SET = LabelSet(("Negative", "Positive"), {"-1": "Negative", "1": "Positive"})
STARS_LABEL_SET = LabelSet(STAR_NAMES, {str(i): name for i, name in enumerate(STAR_NAMES, 1)})


def labels_from_metadata(metadata: Mapping[str, object] | None) -> LabelSet:
    """The label set a publication (``raw_reviews`` and what is built from it) records in its
    metadata; the default three classes for publications made before label sets.
    """
    labels = (metadata or {}).get("labels")
    return LabelSet.from_dict(labels) if labels else DEFAULT_LABEL_SET  # type: ignore[arg-type]


def registered_model_name(base: str, labels: LabelSet) -> str:
    """The MLflow registered model of a label set: one per set of class names, so a champion is only
    ever compared with challengers that predict the same classes.

    The default three classes keep ``base`` (existing champions stay where they are); any other set
    is ``{base}-{names}`` with the class names sorted, lower-cased, spaces as ``_``
    (``review-classifier-negative- positive``,
    ``review-classifier-1_star-2_stars-3_stars-4_stars-5_stars``), plus a short hash when other
    characters or the length could make two sets collide. The order of the names does not matter:
    the gate maps a model's outputs to classes by name.
    """
    names = sorted(labels.names, key=str.casefold)
    if {n.casefold() for n in names} == {n.casefold() for n in LABELS}:
        return base
    slug = "-".join(re.sub(r"[^a-z0-9]+", "_", n.casefold()).strip("_") or "_" for n in names)
    # slug maps back uniquely
    exact = all(re.fullmatch(r"[A-Za-z0-9]+( [A-Za-z0-9]+)*", n) for n in names)
    if not exact or len(slug) > 80:
        digest = hashlib.sha256("\x00".join(n.casefold() for n in names).encode()).hexdigest()[:8]
        slug = f"{slug[:80]}-{digest}"
    return f"{base}-{slug}"
