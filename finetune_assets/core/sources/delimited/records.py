"""CSV / TSV text split into records (the header, good rows column-wise, bad records with their
lines), every physical line accounted for, by the rules the package's docstring
(:mod:`finetune_assets.core.sources.delimited`) describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from finetune_assets.core.sources.delimited.grammar import BARE_CR, Grammar, line_end

RAW_PREFIX_CHARS = 2_000  # how much of a bad record's raw text is kept for the quarantine


@dataclass(frozen=True)
class Bad:
    """A record that is not a good row: where it is, what broke, and its raw text (bounded)."""

    index: int  # record number among data records (0-based, good and bad together)
    line: int  # first physical line, 1-based
    end_line: int
    problem: str
    raw: str
    # the quarantine reason: malformed_row / header_row / ambiguous_line_end
    reason: str = "malformed_row"


@dataclass(frozen=True)
class _Held:
    """The last record, its last field unquoted: the next record decides it (their field counts
    add up to the header's, one of them short: the two may be one review broken by a line end
    inside a field written without quotes).
    """

    good: bool  # appended to the good rows (else the last of ``bad``)
    start: int  # offset in the text, line, record number: where to re-parse it from
    line: int
    end_line: int
    record: int
    line_end: str
    before: str  # the line end before it
    blank_lines: int  # blank lines counted before it
    cr_ends: int  # bare-CR record ends counted before it
    raw: str
    fields: int  # how many fields: with the next record's, one record cut inside a field?
    odd: bool  # its line end differs from the one before it
    second: bool  # already paired with the record before it


@dataclass
class Records:
    header: list[str]
    header_line: int
    columns: list[list[str | None]]  # one list per header column, good rows only
    header_end_line: int = 0
    index: list[int] = field(default_factory=list)  # record number of each good row
    line: list[int] = field(default_factory=list)  # first physical line of each good row
    end_line: list[int] = field(default_factory=list)
    bad: list[Bad] = field(default_factory=list)
    blank_lines: int = 0
    physical_lines: int = 0  # lines of the text parsed (up to ``consumed``)
    first_line: int = 1  # physical line the text starts on
    consumed: int = 0  # where the text not parsed yet (a record the next block may continue) starts
    next_line: int = 1  # line and record number of that text
    next_record: int = 0
    line_end: str = ""  # the line end of the last record ("\n", "\r\n" or "\r")
    held: _Held | None = None  # the last record, when its line end differs from the one before it
    second: bool = False  # the first record of the text was paired with the one before it
    cr_ends: int = 0  # bare CRs taken as record ends so far (line ends the LF count misses)

    @property
    def records(self) -> int:
        return len(self.index) + len(self.bad)


class HeaderError(ValueError):
    """The header line itself cannot be parsed."""


class RecordTooLong(ValueError):
    """Streaming: one physical line longer than ``max_record`` (no line end to resynchronise on)."""


class _Record(NamedTuple):
    """A record that parsed: where it stands in the text and its fields."""

    start: int  # offsets of its content in the text
    end: int
    line: int  # its first and last physical line
    end_line: int
    index: int  # record number among data records
    fields: list[str]
    quoted: bool | None  # its last field was quoted
    line_end: str | None  # what ended it (None: the end of the text)


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
    grammar = Grammar.of(delimiter, quoting, escapechar)
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
    header_key = _header_key(out.header) if out is not None else None
    while pos < n:
        start, start_line = pos, line
        need = ncols if out is not None else 1  # a bare CR ends the header wherever it is
        fields, end, stop, pos, problem, quoted, open_end = grammar.scan(text, pos, need, bare)
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
            _give_up_line(out, text, start, stop, start_line, record_no, problem)
            record_no += 1
            if text[stop : stop + 1] == "\r":
                cr_ends += 1
                last_cr = stop == n - 1
            pos, line = stop + 1, start_line + 1
            continue
        end_line = start_line + text.count("\n", start, end)
        line = end_line + 1
        ended_by_cr = text[min(pos, n) - 1 : min(pos, n)] == "\r"
        if bare and ended_by_cr:  # a bare CR (or last) ended it
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
            header_key = _header_key(fields)
            continue
        record = _Record(start, end, start_line, end_line, record_no, fields, quoted, term)
        second, odd = _place(out, text, record, ncols, header_key)
        # only a short or odd record can pair with the next one (a complete one at a line end like
        # the one before it never does)
        if (odd or len(fields) < ncols) and not quoted and not _header_again(out, record_no):
            out.held = _Held(
                odd=odd,
                second=second,
                good=not out.bad or out.bad[-1].index != record_no,
                start=start,
                line=start_line,
                end_line=end_line,
                record=record_no,
                line_end=term,
                before=out.line_end,
                blank_lines=blank,
                cr_ends=cr_ends - ended_by_cr,
                raw=text[start:end][:RAW_PREFIX_CHARS],
                fields=len(fields),
            )
        out.line_end = term or out.line_end
        record_no += 1
    # decided by the next block: re-parse it
    if out is not None and out.held is not None and not final:
        held, out.held = out.held, None
        _drop_last(out, held)
        pos, line, record_no, blank, out.line_end, cr_ends = (
            held.start,
            held.line,
            held.record,
            held.blank_lines,
            held.before,
            held.cr_ends,
        )
        out.second = held.second  # decided here: re-parsed in the next block, still paired
    if out is None:
        out = Records(header=[], header_line=0, columns=[])
    out.blank_lines = blank
    out.first_line, out.next_line, out.next_record = first_line, line, record_no
    out.consumed = min(pos, n)
    out.cr_ends = cr_ends
    ends = cr_ends - (after.cr_ends if after is not None else 0)  # bare-CR record ends in ``text``
    if final:
        closed = not text or text.endswith("\n") or last_cr
        out.physical_lines = text.count("\n") + ends + (0 if closed else 1)
    else:  # a consumed block ends with its last record's line end
        out.physical_lines = text.count("\n", 0, out.consumed) + ends
    _check_accounting(out)
    return out


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


def _give_up_line(
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


def _place(
    out: Records, text: str, r: _Record, ncols: int, header_key: list[str]
) -> tuple[bool, bool]:
    """Add a parsed record to ``out`` as what it is: the header again, one half of a review broken
    by a line end (``ambiguous_line_end``, the held record before it too), a row with the wrong
    number of fields, or a good row. Returns (paired with the record before it, its line end
    differs from the one before it).
    """
    held, out.held = out.held, None
    # the two could be one record cut by a line break inside a field written without quotes
    # (the held one's last field and this one's first are that field) at a line end unlike
    # those around it: a short first half paired where either side differs (one file may
    # switch line ends at every record), a complete first half only where both do
    adds_up = (
        held is not None
        and held.fields + len(r.fields) - 1 == ncols
        and min(held.fields, len(r.fields)) < ncols
        and text[r.start : r.start + 1] != '"'
    )
    second = (
        (held is None and out.second)
        or adds_up
        and (
            (held.fields < ncols and (held.odd or r.line_end != held.line_end))
            or (held.odd and r.line_end != held.line_end)
        )
    )
    out.second = False
    if second and held is not None:
        _ambiguous(out, held)
    odd = r.line_end is not None and out.line_end != "" and r.line_end != out.line_end
    fields = r.fields
    if (
        len(fields) == ncols
        and len(fields[0]) < len(out.header[0]) + 8
        and _header_key(fields) == header_key
    ):
        problem, reason = "the header row again (files concatenated?)", "header_row"
    elif second:
        problem, reason = _SECOND, "ambiguous_line_end"
    elif len(fields) != ncols:
        problem, reason = f"expected {ncols} fields, found {len(fields)}", "malformed_row"
    else:
        for col, value in zip(out.columns, fields):
            col.append(value)
        out.index.append(r.index)
        out.line.append(r.line)
        out.end_line.append(r.end_line)
        return second, odd
    raw = text[r.start : r.end][:RAW_PREFIX_CHARS]
    out.bad.append(Bad(r.index, r.line, r.end_line, problem, raw, reason))
    return second, odd


def _header_again(out: Records, index: int) -> bool:
    """Record ``index`` was just reported as the header row again (never paired with the next)."""
    return bool(out.bad) and out.bad[-1].index == index and out.bad[-1].reason == "header_row"


_NAMES = {"\n": "LF", "\r\n": "CRLF", "\r": "CR"}
_SECOND = (
    "its fields and the record's before it add up to the header's: the two may be one review "
    "broken by a line end inside a field written without quotes"
)


def _drop_last(out: Records, held: _Held) -> None:
    """Take the held record (the last one parsed) out of ``out``."""
    if held.good:
        for col in out.columns:
            col.pop()
        out.index.pop()
        out.line.pop()
        out.end_line.pop()
    else:
        out.bad.pop()


def _ambiguous(out: Records, held: _Held) -> None:
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


def _header_key(fields: list[str]) -> list[str]:
    return [f.replace("\ufeff", "").strip().casefold() for f in fields]


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
