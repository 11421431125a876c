"""Validate raw rows into accepted reviews and a quarantine table with a reason per row.

Nothing is dropped silently: ``accepted.num_rows + rejected.num_rows == raw.num_rows`` always. A
review's identity and split: :mod:`finetune_assets.core.prep.review_text`; the duplicate index:
:mod:`finetune_assets.core.prep.seen_texts`; copies with different labels:
:mod:`finetune_assets.core.prep.conflicts`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from finetune_assets.core.io.contracts import ACCEPTED_SCHEMA, REJECTED_SCHEMA
from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET, LabelSet
from finetune_assets.core.labels.values import is_missing
from finetune_assets.core.prep.conflicts import (
    POLICIES,
    Plan,
    accepted_after,
    decide,
    promoted_rows,
    rejected_after,
)
from finetune_assets.core.prep.review_text import (  # re-exported: callers import them from here
    NULL_MARKERS,
    SplitRule,
    normalize_text,
    split_column,
    split_key,
    text_key,
)
from finetune_assets.core.prep.seen_texts import SeenTexts

__all__ = [
    "NULL_MARKERS",
    "SeenTexts",
    "SplitRule",
    "StreamValidator",
    "Validated",
    "ValidationRules",
    "normalize_text",
    "split_column",
    "split_key",
    "text_key",
    "validate",
]


@dataclass(frozen=True)
class ValidationRules:
    label_mapping: dict[str, str] | None = (
        None  # overrides the label set's raw-value mapping (same classes)
    )
    max_text_chars: int = 20_000
    labels: LabelSet = field(default_factory=lambda: DEFAULT_LABEL_SET)  # the version's classes
    # each accepted review's train/validation/test
    split: SplitRule = field(default_factory=SplitRule)
    duplicate_conflicts: str = (
        "majority"  # copies with different labels: data.conflicts (or "first")
    )

    def __post_init__(self):
        if self.duplicate_conflicts not in POLICIES:
            raise ValueError(
                f"duplicate_conflicts must be one of {list(POLICIES)}, not "
                f"{self.duplicate_conflicts!r}"
            )
        # raises LabelError (a ValueError) for unknown class names
        if self.label_mapping is not None:
            object.__setattr__(self, "labels", self.labels.with_mapping(self.label_mapping))


@dataclass(frozen=True)
class Validated:
    accepted: pa.Table
    rejected: pa.Table
    # "kept file <- rejected copy's file": duplicates across files, which file order alone decided
    cross_file_duplicates: dict[str, int] = field(default_factory=dict)
    labels: LabelSet = DEFAULT_LABEL_SET

    @property
    def reasons(self) -> dict[str, int]:
        return dict(Counter(self.rejected.column("reason").to_pylist()))

    @property
    def label_counts(self) -> dict[str, int]:
        counts = Counter(self.accepted.column("label").to_pylist())
        return {name: counts.get(name, 0) for name in self.labels.names}


class StreamValidator:
    """Validates a source batch by batch with the same rules and messages as :func:`validate`.

    Only the duplicate index (:class:`SeenTexts`, hashes on disk) and counters outlive a batch, so a
    version of any size validates in the memory of one batch. Counters add up over all batches.
    """

    def __init__(self, rules: ValidationRules):
        self.rules = rules
        self.seen = SeenTexts()
        self.rows_in = self.accepted = self.rejected = 0
        self.reasons: Counter = Counter()
        self.labels: Counter = Counter()
        self.across: Counter = Counter()

    def feed(self, raw: pa.Table) -> Validated:
        result = _validate_batch(
            raw, self.rules, self.seen, self.across, (self.accepted, self.rejected)
        )
        self.rows_in += raw.num_rows
        self.accepted += result.accepted.num_rows
        self.rejected += result.rejected.num_rows
        self.reasons.update(result.rejected.column("reason").to_pylist())
        self.labels.update(result.accepted.column("label").to_pylist())
        # the invariant we promise, checked per batch
        if self.accepted + self.rejected != self.rows_in:
            raise RuntimeError("validation lost rows: accepted + rejected != input")
        return result

    @property
    def label_counts(self) -> dict[str, int]:
        return {name: self.labels.get(name, 0) for name in self.rules.labels.names}

    def conflicts(self) -> Plan:
        """What the duplicate policy changes now that every copy is seen (empty for ``first``)."""
        if self.rules.duplicate_conflicts == "first":
            return Plan()
        return decide(self.seen.conflicting_copies())

    def recount(self, accepted: pa.Table, rejected: pa.Table, first: bool) -> None:
        """Counters from the rows after :meth:`conflicts` was applied (called per batch,
        ``first`` resets).
        """
        if first:
            self.accepted = self.rejected = 0
            self.reasons, self.labels = Counter(), Counter()
        self.accepted += accepted.num_rows
        self.rejected += rejected.num_rows
        self.reasons.update(rejected.column("reason").to_pylist())
        self.labels.update(accepted.column("label").to_pylist())

    def close(self) -> None:
        self.seen.close()


def validate(raw: pa.Table, rules: ValidationRules) -> Validated:
    """All rows of ``raw`` at once (small tables, tests, predict); :class:`StreamValidator` for
    versions.
    """
    validator = StreamValidator(rules)
    try:
        result = validator.feed(raw)
        plan = validator.conflicts()
        if not plan:
            return result
        moved: list[dict] = []
        promoted = promoted_rows(
            plan, [result.rejected], rules.split.split_of_text, ACCEPTED_SCHEMA
        )
        accepted = pa.concat_tables(
            accepted_after(plan, [result.accepted], promoted, moved, REJECTED_SCHEMA)
        )
        rejected = pa.concat_tables(rejected_after(plan, [result.rejected], moved, REJECTED_SCHEMA))
        return Validated(accepted, rejected, result.cross_file_duplicates, rules.labels)
    finally:
        validator.close()


def _validate_batch(
    raw: pa.Table,
    rules: ValidationRules,
    seen_store: SeenTexts,
    across: Counter,
    base: tuple[int, int] = (0, 0),
) -> Validated:
    """One batch; ``base``: the accepted and rejected rows before it (positions for
    data.conflicts).
    """
    accepted: dict[str, list] = {name: [] for name in ACCEPTED_SCHEMA.names}
    rejected: dict[str, list] = {name: [] for name in REJECTED_SCHEMA.names}
    first_across = dict(across)
    new: dict[
        bytes, tuple
    ] = {}  # key -> (label, file, "line N", pos) of a first accepted occurrence here
    copies: list[tuple] = []  # (key, class, position, "a"/"r") of the copies of repeated reviews

    def reject(
        text, label, file, row, reason, detail=None, line=None, line_end=None, raw_text=None
    ):
        for k, v in zip(
            REJECTED_SCHEMA.names,
            (text, label, file, row, reason, detail, line, line_end, raw_text),
        ):
            rejected[k].append(v)

    names = (
        "text",
        "label",
        "source_file",
        "source_row",
        "malformed",
        "malformed_reason",
        "source_line",
        "source_line_end",
        "raw",
    )
    cols = [
        raw.column(n).to_pylist() if n in raw.column_names else [None] * raw.num_rows for n in names
    ]
    keys = [
        normalize_text(t) if t is not None and m is None else "" for t, m in zip(cols[0], cols[4])
    ]
    hashes = [text_key(k) if k else b"" for k in keys]
    earlier = seen_store.lookup([h for h in hashes if h])
    for text, label, file, row, malformed, why, line, line_end, raw_text, key, h in zip(
        *cols, keys, hashes
    ):
        where = (line, line_end, raw_text)
        if malformed is not None:
            reject(text, label, file, row, why or "malformed_row", malformed, *where)
            continue
        if not key or text.strip() in NULL_MARKERS:
            detail = (
                f"a null marker ({text.strip()!r})"
                if key
                else "only invisible characters"
                if text and text.strip()
                else None
            )
            reject(text, label, file, row, "empty_text", detail, *where)
            continue
        text = text.strip()
        if len(text) > rules.max_text_chars:
            reject(
                text,
                label,
                file,
                row,
                "too_long",
                f"{len(text)} characters > {rules.max_text_chars}",
                *where,
            )
            continue
        if is_missing(label):
            reject(
                text,
                label,
                file,
                row,
                "missing_label",
                f"no label ({label.strip()!r} is a missing-value marker)"
                if label and label.strip()
                else "no label",
                *where,
            )
            continue
        mapped = rules.labels.map(label)
        if mapped is None:
            reject(
                text,
                label,
                file,
                row,
                "unknown_label",
                f"label {label!r} is not in the label mapping",
                *where,
            )
            continue
        first = new.get(h) or earlier.get(h)
        if first is not None:
            first_label, first_file, first_where, first_pos = first
            copies += [
                (h, first_label, first_pos, "a"),
                (h, mapped, base[1] + len(rejected["reason"]), "r"),
            ]
            same = first_label == mapped
            copy = f"{first_file} {first_where}" if first_file != file else first_where
            if first_file != file:
                across[f"{first_file} <- {file}"] += 1
            reject(
                text,
                label,
                file,
                row,
                "duplicate" if same else "conflicting_duplicate",
                f"kept copy: {copy}" if same else f"first seen as {first_label} ({copy}, kept)",
                *where,
            )
            continue
        new[h] = (
            mapped,
            file,
            f"line {line}" if line is not None else f"row {row}",
            base[0] + len(accepted["text"]),
        )
        for k, v in zip(ACCEPTED_SCHEMA.names, (text, mapped, file, row, rules.split.of_key(key))):
            accepted[k].append(v)
    seen_store.add(new, copies)
    return Validated(
        accepted=pa.table(accepted, schema=ACCEPTED_SCHEMA),
        rejected=pa.table(rejected, schema=REJECTED_SCHEMA),
        cross_file_duplicates={
            k: v - first_across.get(k, 0) for k, v in across.items() if v != first_across.get(k, 0)
        },
        labels=rules.labels,
    )
