"""Validate raw rows into accepted reviews and a quarantine table with a reason per row.

Nothing is dropped silently: ``accepted.num_rows + rejected.num_rows == raw.num_rows`` always.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from finetune_assets.data.labels import DEFAULT_LABEL_SET, LabelSet

REASONS = ("malformed_row", "empty_text", "non_text", "too_long", "unknown_label", "duplicate",
           "conflicting_duplicate")

ACCEPTED_SCHEMA = pa.schema([
    ("text", pa.string()),
    ("label", pa.string()),
    ("source_file", pa.string()),
    ("source_row", pa.int64()),
])
REJECTED_SCHEMA = pa.schema([
    ("text", pa.string()),
    ("label", pa.string()),
    ("source_file", pa.string()),
    ("source_row", pa.int64()),
    ("reason", pa.string()),
    ("detail", pa.string()),
])


@dataclass(frozen=True)
class ValidationRules:
    label_mapping: dict[str, str] | None = None  # overrides the label set's raw-value mapping (same classes)
    max_text_chars: int = 20_000
    labels: LabelSet = field(default_factory=lambda: DEFAULT_LABEL_SET)  # the version's classes

    def __post_init__(self):
        if self.label_mapping is not None:  # raises LabelError (a ValueError) for unknown class names
            object.__setattr__(self, "labels", self.labels.with_mapping(self.label_mapping))


@dataclass(frozen=True)
class Validated:
    accepted: pa.Table
    rejected: pa.Table
    labels: LabelSet = DEFAULT_LABEL_SET

    @property
    def reasons(self) -> dict[str, int]:
        return dict(Counter(self.rejected.column("reason").to_pylist()))

    @property
    def label_counts(self) -> dict[str, int]:
        counts = Counter(self.accepted.column("label").to_pylist())
        return {name: counts.get(name, 0) for name in self.labels.names}


def normalize_text(text: str) -> str:
    """The identity of a review: NFKC, case-folded, whitespace collapsed (used for dedup and splits)."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def validate(raw: pa.Table, rules: ValidationRules) -> Validated:
    accepted: dict[str, list] = {name: [] for name in ACCEPTED_SCHEMA.names}
    rejected: dict[str, list] = {name: [] for name in REJECTED_SCHEMA.names}
    seen: dict[str, str] = {}  # normalized text -> label of its first accepted occurrence

    def reject(text, label, file, row, reason, detail=None):
        for k, v in zip(REJECTED_SCHEMA.names, (text, label, file, row, reason, detail)):
            rejected[k].append(v)

    cols = [raw.column(n).to_pylist() for n in ("text", "label", "source_file", "source_row", "malformed")]
    for text, label, file, row, malformed in zip(*cols):
        if malformed is not None:
            reject(text, label, file, row, "malformed_row", malformed)
            continue
        if text is not None and text.startswith("\x00non-text:"):
            reject(None, label, file, row, "non_text", text[len("\x00non-text:"):])
            continue
        if text is None or not text.strip():
            reject(text, label, file, row, "empty_text")
            continue
        text = text.strip()
        if len(text) > rules.max_text_chars:
            reject(text, label, file, row, "too_long", f"{len(text)} characters > {rules.max_text_chars}")
            continue
        mapped = rules.labels.map(label)
        if mapped is None:
            reject(text, label, file, row, "unknown_label", f"label {label!r} is not in the label mapping")
            continue
        key = normalize_text(text)
        if key in seen:
            same = seen[key] == mapped
            reject(text, label, file, row, "duplicate" if same else "conflicting_duplicate",
                   None if same else f"first seen as {seen[key]}")
            continue
        seen[key] = mapped
        for k, v in zip(ACCEPTED_SCHEMA.names, (text, mapped, file, row)):
            accepted[k].append(v)
    return Validated(
        accepted=pa.table(accepted, schema=ACCEPTED_SCHEMA),
        rejected=pa.table(rejected, schema=REJECTED_SCHEMA),
        labels=rules.labels,
    )
