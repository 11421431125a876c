"""How a source's label set is decided at registration: given (flags, a folder's manifest) or
inferred.

The set itself (ordered class names, raw value -> class) is
:class:`~finetune_assets.core.labels.label_set.LabelSet`, re-exported here with its constants. A
version records its label set when it is registered; every step downstream (label ids, the model
head and its ``id2label``, class weights, metrics, pictures, predict) follows it. Without an
explicit set, :func:`infer_label_set` applies these rules to the label values found in the source:

* values are compared by :func:`~finetune_assets.core.labels.values.label_key` (NFKC, case, spacing,
  surrounding punctuation, known synonyms such as ``neg`` / ``negative``); missing-value markers
  (``N/A``, ``NaN``, ``?`` ...) are not values (their rows are quarantined as ``missing_label``);
* numeric ``-1`` / ``0`` / ``1`` (``1.0`` too): the default three classes ``Positive`` /
  ``Negative`` / ``Mixed`` (1 / -1 / 0), as before; ``-1`` / ``1`` only: the binary
  ``Negative`` / ``Positive``;
* star ratings, numbers within 1..5 reaching 3 or more: five classes ``1 star`` .. ``5 stars`` in
  numeric order;
* text labels: if every value is a known sentiment name or synonym, the classes are those names,
  capitalized and in polarity order (negative .. positive, see :data:`POLARITY_ORDER`);
  otherwise sorted alphabetically (case-folded), each class named by its first spelling in the data;
* anything else (``0`` / ``1`` only, other numbers, numbers mixed with words) is ambiguous and
  refused with the values found and the flags that settle it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

# re-exported: callers import the label set from here
from finetune_assets.core.labels.label_set import (
    BINARY_LABEL_SET,
    DEFAULT_LABEL_MAPPING,
    DEFAULT_LABEL_SET,
    ID2LABEL,
    LABEL2ID,
    LABELS,
    LABELS_FLAG,
    MAPPING_FLAG,
    MAX_CLASSES,
    POLARITY_ORDER,
    STAR_NAMES,
    STARS_LABEL_SET,
    STARS_TO_SENTIMENT,
    LabelError,
    LabelSet,
    class_name,
    labels_from_metadata,
    normalize_value,
    registered_model_name,
)
from finetune_assets.core.labels.values import is_missing, label_key, shown

__all__ = [
    "BINARY_LABEL_SET",
    "DEFAULT_LABEL_MAPPING",
    "DEFAULT_LABEL_SET",
    "ID2LABEL",
    "LABEL2ID",
    "LABELS",
    "LABELS_FLAG",
    "LabelError",
    "LabelSet",
    "MANIFEST",
    "MAPPING_FLAG",
    "MAX_CLASSES",
    "POLARITY_ORDER",
    "STARS_LABEL_SET",
    "STARS_TO_SENTIMENT",
    "STAR_NAMES",
    "infer_label_set",
    "label_notes",
    "label_set_of_source",
    "labels_from_metadata",
    "normalize_value",
    "parse_labels_flag",
    "parse_mapping_flag",
    "read_manifest",
    "registered_model_name",
    "resolve_label_set",
    "spellings",
]


def _is_number(key: str) -> bool:
    try:
        float(key)
    except ValueError:
        return False
    return True


def _distinct(values: Iterable[str | None]) -> dict[str, str]:
    """Normalized value -> first spelling (NFC, whitespace collapsed), in order of first appearance;
    missing-value markers left out.
    """
    seen: dict[str, str] = {}
    for v in values:
        if is_missing(v):
            continue
        seen.setdefault(label_key(v), class_name(v))
    return seen


def spellings(values: Iterable[str | None]) -> dict[str, list[str]]:
    """Normalized value -> its distinct spellings (at most 5 each), for saying what was merged."""
    out: dict[str, list[str]] = {}
    for v in values:
        if is_missing(v):
            continue
        found = out.setdefault(label_key(v), [])
        if len(found) < 5 and class_name(v) not in found:
            found.append(class_name(v))
    return out


def _flag_hint(found: list[str]) -> str:
    if len(found) == 2:
        return (
            f"pass the class names and the mapping, e.g. {LABELS_FLAG} Negative,Positive "
            f"{MAPPING_FLAG} {found[0]}=Negative,{found[1]}=Positive"
        )
    example = ",".join(f"{v}=<name>" for v in found[:6])
    return (
        f"pass the class names and the mapping, e.g. {LABELS_FLAG} <name>,<name>,... "
        f"{MAPPING_FLAG} {example}"
    )


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
            f"ambiguous labels: the values found mix numbers and words ({shown}); "
            f"{_flag_hint(shown)}"
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
    # known names, capitalized: "Negative", "Very positive"
    if all(k in POLARITY_ORDER for k in words):
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
    """``"0=Negative,1=Positive"`` -> ``{"0": "Negative", "1": "Positive"}``; ``stars-to-sentiment``
    is :data:`STARS_TO_SENTIMENT`.
    """
    if text.strip() == "stars-to-sentiment":
        return dict(STARS_TO_SENTIMENT)
    mapping: dict[str, str] = {}
    spelled: dict[str, str] = {}  # key -> the raw value as the user typed it first
    for item in (p for p in text.split(",") if p.strip()):
        raw, sep, name = item.partition("=")
        if not sep or not raw.strip() or not name.strip():
            raise LabelError(
                f"{MAPPING_FLAG}: {item!r} is not RAW=NAME (e.g. {MAPPING_FLAG} "
                "0=Negative,1=Positive)"
            )
        key = normalize_value(raw)
        if key in mapping and label_key(mapping[key]) != label_key(name):
            same = (
                f"{raw.strip()!r} is mapped twice"
                if spelled[key] == raw.strip()
                else f"{shown([spelled[key], raw.strip()])} are one label value (case, spacing, "
                "Unicode "
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
    """Class names of a mapping given without names: polarity order if all are known, else as
    listed.
    """
    by_key = {}
    for v in mapping.values():
        by_key.setdefault(label_key(v), class_name(v))
    if all(k in POLARITY_ORDER for k in by_key):
        return tuple(by_key[k] for k in sorted(by_key, key=POLARITY_ORDER.index))
    return tuple(by_key.values())


def resolve_label_set(
    values: Iterable[str | None],
    labels: Iterable[str] | None = None,
    mapping: Mapping[str, str] | None = None,
) -> LabelSet:
    """The label set of a source: explicit names and/or mapping, else inferred; every class must
    occur.

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
        # the user passed nothing: speak of what was inferred
        if labels is None and mapping is None:
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
    """What registration read into the label values, said in its output: the binary -1/1 rule,
    merged spellings of one class, missing-value markers (their rows go to quarantine as
    ``missing_label``).
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
        kinds = sorted({repr(class_name(v)) for v in markers})[:8]
        notes.append(
            f"{len(markers) + values.count(None)} rows without a label"
            f"{' (' + ', '.join(kinds) + ')' if kinds else ''}: quarantined as missing_label"
        )
    return notes


def label_set_of_source(
    spec,
    labels: Iterable[str] | None = None,
    mapping: Mapping[str, str] | None = None,
    notes: list[str] | None = None,
) -> LabelSet:
    """Read a source's label column and resolve its label set (what registration records); ``notes``
    receives :func:`label_notes` (the CLI prints them). Rows the reader could not parse are left
    out.
    """
    # lazy, as fsspec in read_manifest: the trainer and predict import this module and read no
    # source (the readers cost ~0.4 s to import)
    import pyarrow.compute as pc

    from finetune_assets.core.sources import iter_source

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
    import fsspec  # lazy: see label_set_of_source

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
