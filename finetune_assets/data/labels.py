"""The label set of a dataset version: its ordered class names and how raw label values map to them.

A version records its label set when it is registered; every step downstream (label ids, the model
head and its ``id2label``, class weights, metrics, pictures, predict) follows it. Without an explicit
set, :func:`infer_label_set` applies these rules to the label values found in the source:

* values are compared by :func:`~finetune_assets.data.label_values.label_key` (NFKC, case, spacing,
  surrounding punctuation, known synonyms such as ``neg`` / ``negative``); missing-value markers
  (``N/A``, ``NaN``, ``?`` ...) are not values (their rows are quarantined as ``missing_label``);
* numeric ``-1`` / ``0`` / ``1`` (``1.0`` too): the seed's three classes ``Positive`` / ``Negative`` /
  ``Mixed`` (1 / -1 / 0), as before; ``-1`` / ``1`` only: the binary ``Negative`` / ``Positive``;
* star ratings, numbers within 1..5 reaching 3 or more: five classes ``1 star`` .. ``5 stars`` in
  numeric order;
* text labels: if every value is a known sentiment name or synonym, the classes are those names,
  capitalized and in polarity order (negative .. positive, see :data:`POLARITY_ORDER`);
  otherwise sorted alphabetically (case-folded), each class named by its first spelling in the data;
* anything else (``0`` / ``1`` only, other numbers, numbers mixed with words) is ambiguous and refused
  with the values found and the flags that settle it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from finetune_assets.data.label_values import is_missing, label_key, shown

MAX_CLASSES = 127  # label ids are stored as int8

# The seed's classes, in the order of ``arbml/arabic_100k_reviews``: the set of numeric 1 / -1 / 0 data.
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

# Known sentiment classes (keys of label_values.SYNONYMS), most negative first; a text label set made
# only of these is ordered by it.
POLARITY_ORDER: tuple[str, ...] = (
    "very negative",
    "negative",
    "mixed",
    "neutral",
    "positive",
    "very positive",
)
STAR_NAMES: tuple[str, ...] = ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")
# The documented one-flag mapping of star ratings to three sentiment classes (README, "Star ratings").
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
    """A label set that cannot be used or inferred; the message names the values and the flag that fixes it."""


normalize_value = label_key  # the identity of a raw label value (label_values module docstring)


def _name(raw: str) -> str:
    """A class name as stored and shown: NFC, whitespace collapsed."""
    import unicodedata

    return " ".join(unicodedata.normalize("NFC", str(raw)).split())


def _is_number(key: str) -> bool:
    try:
        float(key)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class LabelSet:
    """Ordered class names (id = position) and raw value -> name (keys normalized, see :func:`normalize_value`).

    A raw value equal to a class name (case-insensitively) maps to it without a mapping entry.
    """

    names: tuple[str, ...]
    mapping: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = tuple(_name(n) for n in self.names)
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
            key, target = label_key(k), by_key.get(label_key(v), _name(v))
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
                f"the label mapping maps to {unknown}, which are not among the labels {list(names)}; "
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
        """The class of a raw label value, or None when it is not in the set (the row is quarantined)."""
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
        """The same classes with another raw-value mapping (a per-run override of the mapping only)."""
        return LabelSet(self.names, mapping)

    def to_dict(self) -> dict[str, object]:
        return {"names": list(self.names), "mapping": dict(self.mapping)}

    @classmethod
    def from_dict(cls, obj: Mapping[str, object]) -> LabelSet:
        return cls(tuple(obj["names"]), dict(obj.get("mapping") or {}))  # type: ignore[arg-type]

    def fingerprint(self) -> str:
        """Hash of names (in order) and mapping: part of a version's identity and its data version."""
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
    """The label set a publication (``raw_reviews`` and what is built from it) records in its metadata;
    the seed's classes for publications made before label sets.
    """
    labels = (metadata or {}).get("labels")
    return LabelSet.from_dict(labels) if labels else DEFAULT_LABEL_SET  # type: ignore[arg-type]


def _distinct(values: Iterable[str | None]) -> dict[str, str]:
    """Normalized value -> first spelling (NFC, whitespace collapsed), in order of first appearance;
    missing-value markers left out.
    """
    seen: dict[str, str] = {}
    for v in values:
        if is_missing(v):
            continue
        seen.setdefault(label_key(v), _name(v))
    return seen


def spellings(values: Iterable[str | None]) -> dict[str, list[str]]:
    """Normalized value -> its distinct spellings (at most 5 each), for saying what was merged."""
    out: dict[str, list[str]] = {}
    for v in values:
        if is_missing(v):
            continue
        found = out.setdefault(label_key(v), [])
        if len(found) < 5 and _name(v) not in found:
            found.append(_name(v))
    return out


def _flag_hint(found: list[str]) -> str:
    if len(found) == 2:
        return (
            f"pass the class names and the mapping, e.g. {LABELS_FLAG} Negative,Positive "
            f"{MAPPING_FLAG} {found[0]}=Negative,{found[1]}=Positive"
        )
    example = ",".join(f"{v}=<name>" for v in found[:6])
    return f"pass the class names and the mapping, e.g. {LABELS_FLAG} <name>,<name>,... {MAPPING_FLAG} {example}"


def infer_label_set(values: Iterable[str | None]) -> LabelSet:
    """The label set implied by the raw label values of a source (rules in the module docstring)."""
    values = list(values)
    seen = _distinct(values)
    found = list(seen)
    if not found:
        raise LabelError(f"no label values found in the source; {_flag_hint(['0', '1'])}")
    numbers = [k for k in found if _is_number(k)]
    words = [k for k in found if not _is_number(k)]
    shown = sorted(found, key=lambda k: (not _is_number(k), float(k) if _is_number(k) else 0.0, k))
    if numbers and words:
        raise LabelError(
            f"ambiguous labels: the values found mix numbers and words ({shown}); {_flag_hint(shown)}"
        )
    if numbers:
        present = set(numbers)
        if present == {"-1", "0", "1"}:
            return DEFAULT_LABEL_SET
        if present == {"-1", "1"}:
            return BINARY_LABEL_SET
        if present <= {"1", "2", "3", "4", "5"} and max(int(k) for k in present) >= 3:
            return STARS_LABEL_SET
        raise LabelError(
            f"ambiguous labels: the values found are {shown}; only -1/0/1 and 1..5 star ratings "
            f"have a known meaning (-1/0/1 together, -1/1 or 1..5; is 0 negative or positive?); "
            f"{_flag_hint(shown)}"
        )
    if len(words) < 2:
        raise LabelError(
            f"only one label value found ({[seen[k] for k in words]}): a classifier needs at "
            f"least two classes (spellings of one class count once: {spellings(values)})"
        )
    if all(
        k in POLARITY_ORDER for k in words
    ):  # known names, capitalized: "Negative", "Very positive"
        return LabelSet(tuple(k.capitalize() for k in sorted(words, key=POLARITY_ORDER.index)))
    return LabelSet(tuple(seen[k] for k in sorted(words)))


def parse_labels_flag(text: str) -> tuple[str, ...]:
    """``"Negative,Positive"`` -> ``("Negative", "Positive")``."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise LabelError(
            f"{LABELS_FLAG} needs comma-separated class names, e.g. {LABELS_FLAG} Negative,Positive"
        )
    return names


def parse_mapping_flag(text: str) -> dict[str, str]:
    """``"0=Negative,1=Positive"`` -> ``{"0": "Negative", "1": "Positive"}``; ``stars-to-sentiment`` is
    :data:`STARS_TO_SENTIMENT`.
    """
    if text.strip() == "stars-to-sentiment":
        return dict(STARS_TO_SENTIMENT)
    mapping: dict[str, str] = {}
    spelled: dict[str, str] = {}  # key -> the raw value as the user typed it first
    for item in (p for p in text.split(",") if p.strip()):
        raw, sep, name = item.partition("=")
        if not sep or not raw.strip() or not name.strip():
            raise LabelError(
                f"{MAPPING_FLAG}: {item!r} is not RAW=NAME (e.g. {MAPPING_FLAG} 0=Negative,1=Positive)"
            )
        key = normalize_value(raw)
        if key in mapping and label_key(mapping[key]) != label_key(name):
            same = (
                f"{raw.strip()!r} is mapped twice"
                if spelled[key] == raw.strip()
                else f"{shown([spelled[key], raw.strip()])} are one label value (case, spacing, Unicode "
                "form and known synonyms are merged), mapped"
            )
            raise LabelError(
                f"{MAPPING_FLAG}: {same} to {mapping[key]!r} and {name.strip()!r}; keep one"
            )
        mapping[key] = name.strip()
        spelled.setdefault(key, raw.strip())
    if not mapping:
        raise LabelError(
            f"{MAPPING_FLAG} needs RAW=NAME pairs, e.g. {MAPPING_FLAG} 0=Negative,1=Positive"
        )
    return mapping


def _names_from_mapping(mapping: Mapping[str, str]) -> tuple[str, ...]:
    """Class names of a mapping given without names: polarity order if all are known, else as listed."""
    by_key = {}
    for v in mapping.values():
        by_key.setdefault(label_key(v), _name(v))
    if all(k in POLARITY_ORDER for k in by_key):
        return tuple(by_key[k] for k in sorted(by_key, key=POLARITY_ORDER.index))
    return tuple(by_key.values())


def resolve_label_set(
    values: Iterable[str | None],
    labels: Iterable[str] | None = None,
    mapping: Mapping[str, str] | None = None,
) -> LabelSet:
    """The label set of a source: explicit names and/or mapping, else inferred; every class must occur.

    Raw values that map to no class are not an error here: validation quarantines those rows
    (``unknown_label``) and the data contract counts them.
    """
    values = list(values)
    if labels is None and mapping is None:
        label_set = infer_label_set(values)
    else:
        names = tuple(labels) if labels is not None else _names_from_mapping(mapping or {})
        label_set = LabelSet(names, mapping or {})
    counts = dict.fromkeys(label_set.names, 0)
    for v in values:
        name = label_set.map(v)
        if name is not None:
            counts[name] += 1
    missing = [n for n, c in counts.items() if c == 0]
    if missing:
        found = shown(list(_distinct(values).values())[:20])
        what = f"no review in the source has the class{'es' if len(missing) > 1 else ''} {missing}"
        if (
            labels is None and mapping is None
        ):  # the user passed nothing: speak of what was inferred
            raise LabelError(
                f"{what} of the label set inferred from the values found ({found}): "
                f"{label_set.describe()}; {_flag_hint(sorted(_distinct(values)))}"
            )
        if labels is not None and len(missing) == len(label_set.names):
            keys = sorted(_distinct(values))
            fix = (
                f"none of them is a class of {LABELS_FLAG} {','.join(labels)}; map them with "
                f"{MAPPING_FLAG} " + ",".join(f"{k}=<name>" for k in keys[:6])
            )
        elif labels is not None:
            fix = f"drop {missing} from {LABELS_FLAG} {','.join(labels)}"
            fix += f", or fix {MAPPING_FLAG}" if mapping else ""
        else:
            fix = f"fix {MAPPING_FLAG} (it maps to {list(label_set.names)})"
        raise LabelError(f"{what} (values found: {found}); {fix}")
    return label_set


def label_notes(values: Iterable[str | None], label_set: LabelSet) -> list[str]:
    """What registration read into the label values, said in its output: the binary -1/1 rule, merged
    spellings of one class, missing-value markers (their rows go to quarantine as ``missing_label``).
    """
    values = list(values)
    notes = []
    if label_set == BINARY_LABEL_SET:
        notes.append("values -1/1 only: a binary set, -1=Negative, 1=Positive")
    for key, found in spellings(values).items():
        if len(found) > 1:
            notes.append(
                f"spellings merged into {label_set.map(found[0]) or key}: {', '.join(shown(found))}"
            )
    markers = [v for v in values if v is not None and is_missing(v)]
    if markers or None in values:
        kinds = sorted({repr(_name(v)) for v in markers})[:8]
        notes.append(
            f"{len(markers) + values.count(None)} rows without a label"
            f"{' (' + ', '.join(kinds) + ')' if kinds else ''}: quarantined as missing_label"
        )
    return notes


def registered_model_name(base: str, labels: LabelSet) -> str:
    """The MLflow registered model of a label set: one per set of class names, so a champion is only
    ever compared with challengers that predict the same classes.

    The seed's three classes keep ``base`` (existing champions stay where they are); any other set is
    ``{base}-{names}`` with the class names sorted, lower-cased, spaces as ``_`` (``review-classifier-negative-
    positive``, ``review-classifier-1_star-2_stars-3_stars-4_stars-5_stars``), plus a short hash when other
    characters or the length could make two sets collide. The order of the
    names does not matter: the gate maps a model's outputs to classes by name.
    """
    names = sorted(labels.names, key=str.casefold)
    if {n.casefold() for n in names} == {n.casefold() for n in LABELS}:
        return base
    slug = "-".join(re.sub(r"[^a-z0-9]+", "_", n.casefold()).strip("_") or "_" for n in names)
    exact = all(
        re.fullmatch(r"[A-Za-z0-9]+( [A-Za-z0-9]+)*", n) for n in names
    )  # slug maps back uniquely
    if not exact or len(slug) > 80:
        digest = hashlib.sha256("\x00".join(n.casefold() for n in names).encode()).hexdigest()[:8]
        slug = f"{slug[:80]}-{digest}"
    return f"{base}-{slug}"


def label_set_of_source(
    spec,
    labels: Iterable[str] | None = None,
    mapping: Mapping[str, str] | None = None,
    notes: list[str] | None = None,
) -> LabelSet:
    """Read a source's label column and resolve its label set (what registration records); ``notes``
    receives :func:`label_notes` (the CLI prints them). Rows the reader could not parse are left out.
    """
    import pyarrow.compute as pc

    from finetune_assets.data.sources import iter_source

    values: list[str | None] = []
    for table in iter_source(spec):
        values += table.filter(pc.is_null(table.column("malformed"))).column("label").to_pylist()
    label_set = resolve_label_set(values, labels, mapping)
    if notes is not None:
        notes += label_notes(values, label_set)
    return label_set


MANIFEST = (
    "_labels.json"  # beside the data in a landing folder drop; "_" files are never read as data
)


def read_manifest(folder_uri: str) -> LabelSet | None:
    """The label set a folder drop carries in ``_labels.json``, or None without one.

    ``{"labels": ["Negative", "Positive"], "label_mapping": {"0": "Negative", "1": "Positive"}}``;
    either key may be left out, as with ``--labels`` / ``--label-mapping``.
    """
    import fsspec

    fs, path = fsspec.core.url_to_fs(folder_uri)
    manifest = f"{path.rstrip('/')}/{MANIFEST}"
    if not fs.isfile(manifest):
        return None
    try:
        obj = json.loads(fs.cat_file(manifest))
        names, mapping = obj.get("labels"), obj.get("label_mapping")
        if (names is None and mapping is None) or set(obj) - {"labels", "label_mapping"}:
            raise ValueError('expected {"labels": [...], "label_mapping": {...}}')
        if names is not None and not (
            isinstance(names, list) and all(isinstance(n, str) for n in names)
        ):
            raise ValueError('"labels" must be a list of class names')
        if mapping is not None and not (
            isinstance(mapping, dict) and all(isinstance(v, str) for v in mapping.values())
        ):
            raise ValueError('"label_mapping" must map raw values to class names')
    except (ValueError, AttributeError) as err:
        raise LabelError(f"{folder_uri}/{MANIFEST}: {err}") from err
    mapping = {str(k): v for k, v in (mapping or {}).items()}
    return LabelSet(tuple(names) if names is not None else _names_from_mapping(mapping), mapping)
