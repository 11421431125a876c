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


# the raw table's columns, in the order _validate_batch reads them
_RAW_COLUMNS = (
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
    first_across = dict(across)
    cols = [
        raw.column(n).to_pylist() if n in raw.column_names else [None] * raw.num_rows
        for n in _RAW_COLUMNS
    ]
    keys = [
        normalize_text(t) if t is not None and m is None else "" for t, m in zip(cols[0], cols[4])
    ]
    hashes = [text_key(k) if k else b"" for k in keys]
    batch = _Batch(rules, seen_store.lookup([h for h in hashes if h]), across, base)
    for text, label, file, row, malformed, why, line, line_end, raw_text, key, h in zip(
        *cols, keys, hashes
    ):
        where = (line, line_end, raw_text)
        if malformed is not None:
            batch.reject(text, label, file, row, why or "malformed_row", malformed, *where)
        else:
            batch.take(text, label, file, row, key, h, where)
    seen_store.add(batch.new, batch.copies)
    return Validated(
        accepted=pa.table(batch.accepted, schema=ACCEPTED_SCHEMA),
        rejected=pa.table(batch.rejected, schema=REJECTED_SCHEMA),
        cross_file_duplicates={
            k: v - first_across.get(k, 0) for k, v in across.items() if v != first_across.get(k, 0)
        },
        labels=rules.labels,
    )


def _refusal(
    text: str | None, label: str | None, key: str, rules: ValidationRules
) -> tuple[str, str | None] | None:
    """Why a parsed row's text or label cannot be used, as (reason, detail); None when both can.

    ``text`` is stripped unless the reason is ``empty_text``, as the quarantine shows it.
    """
    if not key or text.strip() in NULL_MARKERS:
        detail = (
            f"a null marker ({text.strip()!r})"
            if key
            else "only invisible characters"
            if text and text.strip()
            else None
        )
        return "empty_text", detail
    text = text.strip()
    if len(text) > rules.max_text_chars:
        return "too_long", f"{len(text)} characters > {rules.max_text_chars}"
    if is_missing(label):
        return "missing_label", (
            f"no label ({label.strip()!r} is a missing-value marker)"
            if label and label.strip()
            else "no label"
        )
    return None


class _Batch:
    """One batch's outcome, decided row by row: the accepted and rejected columns, the first
    occurrences of new texts and the copies of repeated ones (for :class:`SeenTexts`).
    """

    def __init__(
        self,
        rules: ValidationRules,
        earlier: dict[bytes, tuple],
        across: Counter,
        base: tuple[int, int],
    ):
        self.rules, self.earlier, self.across, self.base = rules, earlier, across, base
        self.accepted: dict[str, list] = {name: [] for name in ACCEPTED_SCHEMA.names}
        self.rejected: dict[str, list] = {name: [] for name in REJECTED_SCHEMA.names}
        # key -> (label, file, "line N", pos) of a first accepted occurrence here
        self.new: dict[bytes, tuple] = {}
        # (key, class, position, "a"/"r") of the copies of repeated reviews
        self.copies: list[tuple] = []

    def reject(
        self, text, label, file, row, reason, detail=None, line=None, line_end=None, raw_text=None
    ) -> None:
        for k, v in zip(
            REJECTED_SCHEMA.names,
            (text, label, file, row, reason, detail, line, line_end, raw_text),
        ):
            self.rejected[k].append(v)

    def take(self, text, label, file, row, key: str, h: bytes, where: tuple) -> None:
        """A parsed row: quarantined with its reason, or accepted (the first copy of a text)."""
        refusal = _refusal(text, label, key, self.rules)
        if refusal is not None:
            reason, detail = refusal
            shown = text if reason == "empty_text" else text.strip()
            self.reject(shown, label, file, row, reason, detail, *where)
            return
        text = text.strip()
        mapped = self.rules.labels.map(label)
        if mapped is None:
            detail = f"label {label!r} is not in the label mapping"
            self.reject(text, label, file, row, "unknown_label", detail, *where)
            return
        first = self.new.get(h) or self.earlier.get(h)
        if first is not None:
            self._duplicate(first, text, label, mapped, file, row, h, where)
            return
        line = where[0]
        self.new[h] = (
            mapped,
            file,
            f"line {line}" if line is not None else f"row {row}",
            self.base[0] + len(self.accepted["text"]),
        )
        split = self.rules.split.of_key(key)
        for k, v in zip(ACCEPTED_SCHEMA.names, (text, mapped, file, row, split)):
            self.accepted[k].append(v)

    def _duplicate(self, first, text, label, mapped, file, row, h, where) -> None:
        """A copy of a text accepted before (in this batch or an earlier one): quarantined, as a
        ``duplicate`` or, with another label, a ``conflicting_duplicate``.
        """
        first_label, first_file, first_where, first_pos = first
        self.copies += [
            (h, first_label, first_pos, "a"),
            (h, mapped, self.base[1] + len(self.rejected["reason"]), "r"),
        ]
        same = first_label == mapped
        copy = f"{first_file} {first_where}" if first_file != file else first_where
        if first_file != file:
            self.across[f"{first_file} <- {file}"] += 1
        self.reject(
            text,
            label,
            file,
            row,
            "duplicate" if same else "conflicting_duplicate",
            f"kept copy: {copy}" if same else f"first seen as {first_label} ({copy}, kept)",
            *where,
        )
