"""The splitting of a CSV / TSV block into records: each record scanned (:mod:`.grammar`), placed
(:mod:`.placement`), and the block's end (where the next block goes on, its physical lines
accounted for).
"""

from __future__ import annotations

from typing import NamedTuple

from finetune_assets.core.sources.delimited.grammar import BARE_CR, Grammar, line_end
from finetune_assets.core.sources.delimited.placement import (
    give_up_line,
    header_again,
    header_key,
    hold,
    place,
    unhold,
)
from finetune_assets.core.sources.delimited.records import (
    HeaderError,
    Records,
    RecordTooLong,
)


def split_records(
    text: str,
    delimiter: str,
    *,
    final: bool = True,
    after: Records | None = None,
    max_record: int | None = None,
    quoting: bool = True,
    escapechar: str | None = None,
) -> Records:
    """Every record of ``text`` (header first), good rows column-wise, bad records with their lines.

    ``final=False``: ``text`` is one block of a longer file; a record whose parse reaches the end of
    ``text`` (it may go on in the next block) is left unparsed from ``consumed`` on. ``after``: the
    previous block's result (its header, next line and record number are continued). A record still
    open after ``max_record`` characters is not carried on (memory stays bounded): it costs its
    first physical line, like any broken record, so rows in still equal accepted + rejected;
    :class:`RecordTooLong` if that one line is longer. ``quoting=False`` (a TSV export without
    quoting, ``5" screen``): a quote is an ordinary character and every line is one record.
    ``escapechar`` (``\\``, MySQL / PostgreSQL dumps writing ``\\"`` for a quote): that character
    keeps the next one as text (a quote, the delimiter, a line end, itself), in quoted and unquoted
    fields, as Python's ``csv`` reads it; doubled quotes still read as one.
    """
    # classic Mac line ends (old exports)
    if final and after is None and "\n" not in text and "\r" in text:
        text = text.replace("\r", "\n")
    scan = Grammar.of(delimiter, quoting, escapechar).scan
    cr_ends = after.cr_ends if after is not None else 0
    last_cr = False  # the text's last character is a CR counted as a record end
    bare = BARE_CR.search(text) is not None  # else no record ends at a bare CR: not looked for
    n = len(text)
    pos = 0
    line = after.next_line if after is not None else 1
    record_no = after.next_record if after is not None else 0
    first_line = line
    out = _continued(after)
    blank = 0
    ncols = len(out.header) if out is not None else 0
    header = header_key(out.header) if out is not None else None
    while pos < n:
        start, start_line = pos, line
        need = ncols if out is not None else 1  # a bare CR ends the header wherever it is
        fields, end, stop, pos, problem, quoted, open_end = scan(text, pos, need, bare)
        if open_end and not final:
            if max_record is None or n - start <= max_record:
                pos, line = start, start_line  # carried into the next block
                break
            if stop == n:
                raise RecordTooLong(
                    f"line {start_line}: no line end within {max_record} characters"
                )
            problem = (
                problem or f"a record still open after {max_record} characters (an unclosed quote?)"
            )
        if problem is not None:  # grammar broken: only the first physical line is given up
            if out is None:
                raise HeaderError(f"line {start_line}: the header cannot be parsed: {problem}")
            give_up_line(out, text, start, stop, start_line, record_no, problem)
            record_no += 1
            if text[stop : stop + 1] == "\r":
                cr_ends += 1
                last_cr = stop == n - 1
            pos, line = stop + 1, start_line + 1
            continue
        end_line = start_line + text.count("\n", start, end)
        line = end_line + 1
        # (a CR before ``pos`` is always a bare one: a CRLF's LF would be there)
        ended_by_cr = bare and text[min(pos, n) - 1 : min(pos, n)] == "\r"
        if ended_by_cr:  # a bare CR (or last) ended it
            cr_ends += 1
            last_cr = pos >= n
        if len(fields) == 1 and fields[0] == "" and not quoted:
            blank += 1
            continue
        term = line_end(text, pos)
        if out is None:
            out = Records(header=fields, header_line=start_line, columns=[[] for _ in fields])
            out.header_end_line, out.line_end = end_line, term or ""
            ncols = len(fields)
            header = header_key(fields)
            continue
        at = (start, end, start_line, end_line, record_no)
        second, odd = place(out, text, fields, at, term, ncols, header)
        # only a short or odd record can pair with the next one (a complete one at a line end like
        # the one before it never does)
        if (odd or len(fields) < ncols) and not quoted and not header_again(out, record_no):
            cr_before = cr_ends - ended_by_cr
            out.held = hold(out, text, fields, at, term, odd, second, blank, cr_before)
        out.line_end = term or out.line_end
        record_no += 1
    cursor = _Cursor(min(pos, n), line, record_no, blank, cr_ends)
    if out is not None and out.held is not None and not final:  # decided by the next block
        held = unhold(out)
        cursor = _Cursor(held.start, held.line, held.record, held.blank_lines, held.cr_ends)
    if out is None:
        out = Records(header=[], header_line=0, columns=[])
    cr_ends_before = after.cr_ends if after is not None else 0
    return _close(out, text, cursor, first_line, final, cr_ends_before, last_cr)


def _continued(after: Records | None) -> Records | None:
    """The result a block starts from: the previous block's header and line-end state, no rows."""
    if after is None or not after.header:
        return None
    return Records(
        header=after.header,
        header_line=after.header_line,
        columns=[[] for _ in after.header],
        header_end_line=after.header_end_line,
        line_end=after.line_end,
        second=after.second,
    )


class _Cursor(NamedTuple):
    """Where a block's parsing stopped: the text not parsed yet, and the counts up to it."""

    consumed: int
    line: int  # the line and record number the rest starts with
    record: int
    blank_lines: int
    cr_ends: int  # bare-CR record ends counted so far (previous blocks included)


def _close(
    out: Records,
    text: str,
    cursor: _Cursor,
    first_line: int,
    final: bool,
    cr_ends_before: int,
    last_cr: bool,
) -> Records:
    """``out`` with where the block stopped and its physical lines, the accounting checked.

    ``cr_ends_before``: the bare-CR record ends of the blocks before this one; ``last_cr``: the
    text's last character is a CR counted as a record end.
    """
    out.blank_lines = cursor.blank_lines
    out.first_line, out.next_line, out.next_record = first_line, cursor.line, cursor.record
    out.consumed = cursor.consumed
    out.cr_ends = cursor.cr_ends
    ends = cursor.cr_ends - cr_ends_before  # bare-CR record ends in ``text``
    if final:
        closed = not text or text.endswith("\n") or last_cr
        out.physical_lines = text.count("\n") + ends + (0 if closed else 1)
    else:  # a consumed block ends with its last record's line end
        out.physical_lines = text.count("\n", 0, out.consumed) + ends
    _check_accounting(out)
    return out


def _check_accounting(r: Records) -> None:
    """Every physical line is the header, part of a record, a bad record's line, or blank."""
    if not r.header:
        return
    used = (
        r.header_end_line - r.header_line + 1 if r.header_line >= r.first_line else 0
    ) + r.blank_lines
    used += sum(r.end_line) - sum(r.line) + len(r.line)
    used += sum(b.end_line - b.line + 1 for b in r.bad)
    if used != r.physical_lines:
        raise AssertionError(
            f"line accounting broken: {used} lines accounted, {r.physical_lines} in the text"
        )
