"""What each record of a CSV / TSV block is, once its grammar is known: a good row, the header
again, a row with the wrong number of fields, a broken record's first line, or one half of a review
broken by a line end (``ambiguous_line_end``), which the next record decides: the last record, when
it may be such a half, is held (:class:`~.records.Held`) until then.
"""

from __future__ import annotations

from finetune_assets.core.sources.delimited.records import (
    RAW_PREFIX_CHARS,
    Bad,
    Held,
    Records,
    Span,
)

_NAMES = {"\n": "LF", "\r\n": "CRLF", "\r": "CR"}
_SECOND = (
    "its fields and the record's before it add up to the header's: the two may be one review "
    "broken by a line end inside a field written without quotes"
)


def header_key(fields: list[str]) -> list[str]:
    """A header's (or a record's) fields as compared for "the header row again"."""
    return [f.replace("\ufeff", "").strip().casefold() for f in fields]


def place(
    out: Records,
    text: str,
    fields: list[str],
    at: Span,
    line_end: str | None,
    ncols: int,
    header: list[str],
) -> tuple[bool, bool]:
    """Add a parsed record to ``out`` as what it is: the header again, one half of a review broken
    by a line end (``ambiguous_line_end``, the held record before it too), a row with the wrong
    number of fields, or a good row. ``header``: :func:`header_key` of the header.

    Returns (paired with the record before it, its line end differs from the one before it).
    """
    start, end, line, end_line, index = at
    held, out.held = out.held, None
    # the two could be one record cut by a line break inside a field written without quotes
    # (the held one's last field and this one's first are that field) at a line end unlike
    # those around it: a short first half paired where either side differs (one file may
    # switch line ends at every record), a complete first half only where both do
    adds_up = (
        held is not None
        and held.fields + len(fields) - 1 == ncols
        and min(held.fields, len(fields)) < ncols
        and text[start : start + 1] != '"'
    )
    second = (
        (held is None and out.second)
        or adds_up
        and (
            (held.fields < ncols and (held.odd or line_end != held.line_end))
            or (held.odd and line_end != held.line_end)
        )
    )
    out.second = False
    if second and held is not None:
        _ambiguous(out, held)
    odd = line_end is not None and out.line_end != "" and line_end != out.line_end
    if (
        len(fields) == ncols
        and len(fields[0]) < len(out.header[0]) + 8
        and header_key(fields) == header
    ):
        problem, reason = "the header row again (files concatenated?)", "header_row"
    elif second:
        problem, reason = _SECOND, "ambiguous_line_end"
    elif len(fields) != ncols:
        problem, reason = f"expected {ncols} fields, found {len(fields)}", "malformed_row"
    else:
        for col, value in zip(out.columns, fields):
            col.append(value)
        out.index.append(index)
        out.line.append(line)
        out.end_line.append(end_line)
        return second, odd
    out.bad.append(Bad(index, line, end_line, problem, text[start:end][:RAW_PREFIX_CHARS], reason))
    return second, odd


def header_again(out: Records, index: int) -> bool:
    """Record ``index`` was just reported as the header row again (never paired with the next)."""
    return bool(out.bad) and out.bad[-1].index == index and out.bad[-1].reason == "header_row"


def hold(
    out: Records,
    text: str,
    fields: list[str],
    at: Span,
    line_end: str | None,
    odd: bool,
    second: bool,
    blank_lines: int,
    cr_ends: int,
) -> Held:
    """The record just placed, kept for the next record to decide (they may be the two halves of
    one review); ``blank_lines``, ``cr_ends``: the counts before it.
    """
    start, end, line, end_line, index = at
    return Held(
        odd=odd,
        second=second,
        good=not out.bad or out.bad[-1].index != index,
        start=start,
        line=line,
        end_line=end_line,
        record=index,
        line_end=line_end,
        before=out.line_end,
        blank_lines=blank_lines,
        cr_ends=cr_ends,
        raw=text[start:end][:RAW_PREFIX_CHARS],
        fields=len(fields),
    )


def unhold(out: Records) -> Held:
    """The held record at a block's end, taken out of ``out``: the next block parses it again
    (still paired with the record before it if it was).
    """
    held, out.held = out.held, None
    _drop_last(out, held)
    out.line_end, out.second = held.before, held.second
    return held


def give_up_line(
    out: Records, text: str, start: int, stop: int, line: int, index: int, problem: str
) -> None:
    """A record that breaks the grammar costs its first physical line (``start`` to ``stop``),
    reported with what broke; a record held before it after an odd line end goes with it.
    """
    if out.held is not None and out.held.odd:  # broken after an odd line end: both go
        _ambiguous(out, out.held)
    out.held = None
    raw = text[start : stop - 1] if text[stop - 1 : stop] == "\r" else text[start:stop]
    out.bad.append(Bad(index, line, line, problem, raw[:RAW_PREFIX_CHARS]))


def _drop_last(out: Records, held: Held) -> None:
    """Take the held record (the last one parsed) out of ``out``."""
    if held.good:
        for col in out.columns:
            col.pop()
        out.index.pop()
        out.line.pop()
        out.end_line.pop()
    else:
        out.bad.pop()


def _ambiguous(out: Records, held: Held) -> None:
    """The held record is one line of a review whose line break was taken for a record end:
    quarantined.
    """
    if not held.good and out.bad[-1].reason == "header_row":
        return
    _drop_last(out, held)
    out.bad.append(
        Bad(
            held.record,
            held.line,
            held.end_line,
            f"its fields and the next record's add up to the header's (ends with "
            f"{_NAMES[held.line_end]}): the two may be one review broken by a line end inside a "
            "field written without quotes",
            held.raw,
            "ambiguous_line_end",
        )
    )
