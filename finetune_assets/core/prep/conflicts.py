"""Copies of one review with different labels: decided once every copy has been seen.

``majority`` (the default): with 3 or more copies and one label held by more than half of them, that
label wins (a copy holding it is the accepted one, the others are ``duplicate`` /
``conflicting_duplicate``); otherwise every copy, the first included, is quarantined as
``conflicting_duplicate`` (no training on a coin flip). ``first``: the first copy read is kept, as
before.

Validation streams (the first copy is written before a later one is read), so the decision is a plan
of edits by position applied afterwards (:func:`apply_plan`); it is empty, and costs nothing, when
no review has conflicting copies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

POLICIES = ("majority", "first")


@dataclass
class Plan:
    """Edits by global row position (accepted: its index in the accepted rows; rejected:
    likewise).
    """

    # accepted pos -> detail (quarantined)
    drop_accepted: dict[int, str] = field(default_factory=dict)
    # rejected pos -> class (becomes the accepted copy)
    promote: dict[int, str] = field(default_factory=dict)
    # rejected pos -> (reason, detail)
    relabel: dict[int, tuple[str, str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.drop_accepted or self.promote or self.relabel)


def decide(copies: Iterable[tuple[bytes, str, int, str]]) -> Plan:
    """``copies``: (text hash, class, position, "a"ccepted / "r"ejected) of every copy of the
    reviews that have copies with different classes; the accepted one is the first copy read.
    """
    by_key: dict[bytes, list[tuple[str, int, str]]] = {}
    for h, label, pos, kind in copies:
        by_key.setdefault(h, []).append((label, pos, kind))
    plan = Plan()
    for group in by_key.values():
        counts = Counter(label for label, _, _ in group)
        total = sum(counts.values())
        label, n = counts.most_common(1)[0]
        winner = label if total >= 3 and 2 * n > total else None
        shown = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
        accepted = next((c for c in group if c[2] == "a"), None)
        if accepted is None:
            continue
        if winner is None:
            detail = f"no majority label among {total} copies ({shown})"
            plan.drop_accepted[accepted[1]] = detail
            for _lab, pos, kind in group:
                if kind == "r":
                    plan.relabel[pos] = ("conflicting_duplicate", detail)
            continue
        detail = f"majority label {winner} ({shown})"
        if accepted[0] != winner:
            plan.drop_accepted[accepted[1]] = f"outvoted: {detail}"
            promoted = min(pos for lab, pos, kind in group if kind == "r" and lab == winner)
            plan.promote[promoted] = winner
        for lab, pos, kind in group:
            if kind == "r" and pos not in plan.promote:
                plan.relabel[pos] = (
                    ("duplicate", f"{detail}; one copy kept")
                    if lab == winner
                    else ("conflicting_duplicate", f"outvoted: {detail}")
                )
    return plan


def promoted_rows(
    plan: Plan, rejected: Iterable[pa.Table], split_of, schema: pa.Schema
) -> pa.Table:
    """The rejected copies the plan accepts, as accepted rows (``split_of(text)``: their split)."""
    rows, pos = [], 0
    for table in rejected:
        for i in sorted(p - pos for p in plan.promote if pos <= p < pos + table.num_rows):
            row = table.slice(i, 1).to_pylist()[0]
            rows.append(
                {
                    "text": row["text"].strip(),
                    "label": plan.promote[pos + i],
                    "split": split_of(row["text"]),
                    "source_file": row["source_file"],
                    "source_row": row["source_row"],
                }
            )
        pos += table.num_rows
    return pa.Table.from_pylist(rows, schema=schema)


def accepted_after(
    plan: Plan,
    accepted: Iterable[pa.Table],
    promoted: pa.Table,
    moved: list[dict],
    rejected_schema: pa.Schema,
) -> Iterator[pa.Table]:
    """The accepted rows without the ones the plan quarantines (appended to ``moved``), then
    ``promoted``.
    """
    pos = 0
    for table in accepted:
        n = table.num_rows
        drop = sorted(p - pos for p in plan.drop_accepted if pos <= p < pos + n)
        if drop:
            for i in drop:
                row = table.slice(i, 1).to_pylist()[0]
                out = dict.fromkeys(rejected_schema.names)
                out.update(
                    text=row["text"],
                    label=row["label"],
                    source_file=row["source_file"],
                    source_row=row["source_row"],
                    reason="conflicting_duplicate",
                    detail=plan.drop_accepted[pos + i],
                )
                moved.append(out)
            mask = [True] * n
            for i in drop:
                mask[i] = False
            table = table.filter(pa.array(mask))
        pos += n
        yield table
    if promoted.num_rows:
        yield promoted


def rejected_after(
    plan: Plan, rejected: Iterable[pa.Table], moved: list[dict], schema: pa.Schema
) -> Iterator[pa.Table]:
    """The rejected rows relabelled by the plan, without the promoted ones, then the ``moved``
    rows.
    """
    pos = 0
    for table in rejected:
        n = table.num_rows
        touched = [p - pos for p in (*plan.promote, *plan.relabel) if pos <= p < pos + n]
        if touched:
            rows = table.to_pylist()
            for i in sorted(touched):
                if pos + i in plan.relabel:
                    rows[i]["reason"], rows[i]["detail"] = plan.relabel[pos + i]
            table = pa.Table.from_pylist(
                [r for i, r in enumerate(rows) if pos + i not in plan.promote], schema=schema
            )
        pos += n
        yield table
    if moved:
        yield pa.Table.from_pylist(moved, schema=schema)
