"""Validate raw rows into accepted reviews and a quarantine table with a reason per row.

Nothing is dropped silently: ``accepted.num_rows + rejected.num_rows == raw.num_rows`` always.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from finetune_assets.contracts import ACCEPTED_SCHEMA, REJECTED_SCHEMA, SPLITS
from finetune_assets.data.conflicts import (
    POLICIES,
    Plan,
    accepted_after,
    decide,
    promoted_rows,
    rejected_after,
)
from finetune_assets.data.label_values import is_missing
from finetune_assets.data.labels import DEFAULT_LABEL_SET, LabelSet

# Code points removed before validation and duplicate detection (documented in docs/reliability.md):
# format characters (Unicode category Cf: zero-width space/joiners, LRM/RLM, bidi embeddings and
# isolates, word joiner, BOM, soft hyphen, Arabic letter mark ...), control characters other than
# whitespace (Cc), variation selectors, and the blank fillers U+115F, U+1160, U+3164, U+FFA0, U+2800.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f"  # Cc that is not whitespace
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"  # Cf (Unicode 14)
    "\u034f\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0"  # blank fillers, grapheme joiner
    "\ufe00-\ufe0f\U000e0100-\U000e01ef]"  # variation selectors
)


# Cells that spreadsheets, pandas, R and database dumps write for "no value" (pyarrow's list, plus \\N):
# a review that is only one of these is empty, not a review.
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
    """The ``split`` column raw_reviews stored (dictionary-encoded); a table without one is an error."""
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


@dataclass(frozen=True)
class ValidationRules:
    label_mapping: dict[str, str] | None = (
        None  # overrides the label set's raw-value mapping (same classes)
    )
    max_text_chars: int = 20_000
    labels: LabelSet = field(default_factory=lambda: DEFAULT_LABEL_SET)  # the version's classes
    split: SplitRule = field(
        default_factory=SplitRule
    )  # each accepted review's train/validation/test
    duplicate_conflicts: str = (
        "majority"  # copies with different labels: data.conflicts (or "first")
    )

    def __post_init__(self):
        if self.duplicate_conflicts not in POLICIES:
            raise ValueError(
                f"duplicate_conflicts must be one of {list(POLICIES)}, not {self.duplicate_conflicts!r}"
            )
        if (
            self.label_mapping is not None
        ):  # raises LabelError (a ValueError) for unknown class names
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


def normalize_text(text: str) -> str:
    """The identity of a review: invisible code points removed, NFKC, case-folded, whitespace collapsed.

    Used for emptiness, duplicate detection and split assignment, so a review prefixed with a
    right-to-left mark is the same review (same split) as the plain one.
    """
    return " ".join(unicodedata.normalize("NFKC", _INVISIBLE.sub("", text)).casefold().split())


_NON_WORD = re.compile(r"[\W_]+")


def split_key(normalized: str) -> str:
    """Coarser than duplicate detection: everything but letters and digits removed (punctuation, spacing,
    symbols, combining marks), so ``Great, phone!`` and ``great phone`` share a split though both are
    kept; a review without letters or digits keeps its text.
    """
    return _NON_WORD.sub("", normalized) or normalized


def text_key(normalized: str) -> bytes:
    """The duplicate-detection identity of a review: a 16-byte hash of its normalized text (never the text)."""
    return hashlib.blake2b(normalized.encode(), digest_size=16).digest()


class SeenTexts:
    """Normalized-text hash -> (class, file, "line N") of its first accepted copy, on disk (SQLite, temp file).

    Memory stays flat whatever the version's size: SQLite keeps at most ``cache_mb`` of pages in this
    process (about 70 bytes a review: 64 MB filled at ~0.9M rows, a 1.2x rise over 0.1M, so 16 MB; the
    rest of the file is served from the OS page cache, which is not the process's memory). The file is a
    temporary one, removed on ``close``.
    """

    def __init__(self, cache_mb: int = 16):
        import sqlite3
        import tempfile

        self._dir = tempfile.TemporaryDirectory(prefix="seen-texts-")
        self._db = sqlite3.connect(f"{self._dir.name}/seen.db")
        self._db.executescript(
            f"PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-{cache_mb * 1024};"
            "CREATE TABLE seen (h BLOB PRIMARY KEY, label TEXT, file TEXT, loc TEXT, pos INTEGER) WITHOUT ROWID;"
            # every copy of a review that has more than one (decided by data.conflicts at the end)
            "CREATE TABLE copies (h BLOB, label TEXT, pos INTEGER, kind TEXT, PRIMARY KEY (kind, pos));"
        )

    def lookup(self, keys: list[bytes]) -> dict[bytes, tuple[str, str, str, int]]:
        found: dict[bytes, tuple[str, str, str, int]] = {}
        unique = list(dict.fromkeys(keys))
        for i in range(0, len(unique), 900):
            chunk = unique[i : i + 900]
            rows = self._db.execute(
                f"SELECT h, label, file, loc, pos FROM seen WHERE h IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            found.update((h, (label, file, loc, pos)) for h, label, file, loc, pos in rows)
        return found

    def add(
        self, entries: dict[bytes, tuple[str, str, str, int]], copies: list[tuple] = ()
    ) -> None:
        self._db.executemany(
            "INSERT INTO seen VALUES (?, ?, ?, ?, ?)", ((h, *v) for h, v in sorted(entries.items()))
        )
        self._db.executemany("INSERT OR IGNORE INTO copies VALUES (?, ?, ?, ?)", copies)
        self._db.commit()

    def conflicting_copies(self) -> list[tuple[bytes, str, int, str]]:
        """Every copy of the reviews whose copies carry more than one class."""
        return self._db.execute(
            "SELECT h, label, pos, kind FROM copies WHERE h IN "
            "(SELECT h FROM copies GROUP BY h HAVING COUNT(DISTINCT label) > 1) ORDER BY h, kind, pos"
        ).fetchall()

    def close(self) -> None:
        self._db.close()
        self._dir.cleanup()


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
        if (
            self.accepted + self.rejected != self.rows_in
        ):  # the invariant we promise, checked per batch
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
        """Counters from the rows after :meth:`conflicts` was applied (called per batch, ``first`` resets)."""
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
    """All rows of ``raw`` at once (small tables, tests, predict); :class:`StreamValidator` for versions."""
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
    """One batch; ``base``: the accepted and rejected rows before it (positions for data.conflicts)."""
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
