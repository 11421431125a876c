"""Split CSV / TSV text into records with exact line accounting, strict about quotes (RFC 4180).

Why not pyarrow's CSV reader or Python's ``csv``: both are lenient about quotes, so one stray ``"``
silently swallows every line up to the next quote (merging reviews into one accepted row, or
collapsing hundreds of lines into one malformed row), and pyarrow fails a whole file on a value
longer than its block size. Measured in ``benchmarks/csv_readers.py``.

The grammar: a field is either quoted (``"..."`` with inner quotes doubled, newlines allowed) or
unquoted (no quote character and no newline in it); fields are separated by the delimiter and a
record ends at ``\\n`` / ``\\r\\n`` / end of file. A record that breaks the grammar costs exactly
its first physical line: that line is reported (line number, bounded raw prefix, what broke) and
parsing resumes on the next line, so the records after a stray quote are read normally. A record
that parses but has the wrong number of fields is reported whole (its boundaries are sound).
Every physical line ends up in exactly one of: the header, a record, a reported bad record, or
a blank line; :func:`split_records` checks that sum against ``text.count("\\n")``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

RAW_PREFIX_CHARS = 2_000  # how much of a bad record's raw text is kept for the quarantine


@dataclass(frozen=True)
class Bad:
    """A record that is not a good row: where it is, what broke, and its raw text (bounded)."""

    index: int  # record number among data records (0-based, good and bad together)
    line: int  # first physical line, 1-based
    end_line: int
    problem: str
    raw: str


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
    physical_lines: int = 0

    @property
    def records(self) -> int:
        return len(self.index) + len(self.bad)


class HeaderError(ValueError):
    """The header line itself cannot be parsed."""


def _field_pattern(delimiter: str) -> re.Pattern:
    d = re.escape(delimiter)
    # quoted (unrolled loop: fast on megabyte values, no recursion), else unquoted (possibly empty)
    return re.compile(rf'"([^"]*(?:""[^"]*)*)"|([^"{d}\n]*)')


def split_records(text: str, delimiter: str) -> Records:
    """Every record of ``text`` (header first), good rows column-wise, bad records with their lines."""
    if "\n" not in text and "\r" in text:  # classic Mac line ends (old spreadsheet exports)
        text = text.replace("\r", "\n")
    match = _field_pattern(delimiter).match
    n = len(text)
    pos, line = 0, 1
    out: Records | None = None
    blank = record_no = ncols = 0
    while pos < n:
        start, start_line = pos, line
        problem = quoted = None
        stop = text.find("\n", pos)
        stop = n if stop < 0 else stop
        if text.find('"', pos, stop) < 0:  # fast path: a line without quotes is one record
            end = stop - 1 if stop > pos and text[stop - 1] == "\r" else stop
            fields = text[pos:end].split(delimiter)
            pos = stop + 1
        else:
            fields, end, pos, problem, quoted = _parse_record(text, pos, delimiter, match)
        if problem is not None:  # grammar broken: only the first physical line is given up
            if out is None:
                raise HeaderError(f"line {start_line}: the header cannot be parsed: {problem}")
            raw = text[start:stop - 1] if text[stop - 1:stop] == "\r" else text[start:stop]
            out.bad.append(Bad(record_no, start_line, start_line, problem, raw[:RAW_PREFIX_CHARS]))
            record_no += 1
            pos, line = stop + 1, start_line + 1
            continue
        end_line = start_line + text.count("\n", start, end)
        line = end_line + 1
        if len(fields) == 1 and fields[0] == "" and not quoted:
            blank += 1
            continue
        if out is None:
            out = Records(header=fields, header_line=start_line, columns=[[] for _ in fields])
            out.header_end_line = end_line
            ncols = len(fields)
            continue
        if len(fields) != ncols:
            out.bad.append(Bad(record_no, start_line, end_line, f"expected {ncols} fields, found {len(fields)}",
                               text[start:end][:RAW_PREFIX_CHARS]))
        else:
            for col, value in zip(out.columns, fields):
                col.append(value)
            out.index.append(record_no)
            out.line.append(start_line)
            out.end_line.append(end_line)
        record_no += 1
    if out is None:
        out = Records(header=[], header_line=0, columns=[])
    out.blank_lines = blank
    out.physical_lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    _check_accounting(out)
    return out


def _parse_record(text: str, pos: int, delimiter: str, match) -> tuple[list[str], int, int, str | None, bool]:
    """One record with quotes in it: (fields, end of its content, next position, problem, last field quoted)."""
    fields: list[str] = []
    while True:
        m = match(text, pos)
        quoted, plain = m.group(1), m.group(2)
        end = m.end()
        fields.append(plain if quoted is None else quoted.replace('""', '"') if '"' in quoted else quoted)
        c = text[end:end + 1]
        if c == delimiter:
            pos = end + 1
            continue
        if c == "\n" or c == "":
            if quoted is None and plain.endswith("\r"):
                fields[-1] = plain[:-1]
            return fields, end, end + 1, None, quoted is not None
        if c == "\r" and text[end + 1:end + 2] in ("\n", ""):
            return fields, end, end + 2, None, quoted is not None
        k = len(fields)
        if quoted is None and plain == "":
            problem = f"field {k} opens a quote that is never closed"
        elif quoted is None:
            problem = f"a quote inside unquoted field {k} (quote the whole field, doubling inner quotes)"
        else:
            problem = (f"text after the closing quote of field {k} (an undoubled quote inside a quoted field, "
                       "or a stray quote)")
        return fields, end, end, problem, False


def _check_accounting(r: Records) -> None:
    """Every physical line is the header, part of a record, a bad record's line, or blank."""
    if not r.header:
        return
    used = (r.header_end_line - r.header_line + 1) + r.blank_lines
    used += sum(r.end_line) - sum(r.line) + len(r.line)
    used += sum(b.end_line - b.line + 1 for b in r.bad)
    if used != r.physical_lines:
        raise AssertionError(f"line accounting broken: {used} lines accounted, {r.physical_lines} in the file")
