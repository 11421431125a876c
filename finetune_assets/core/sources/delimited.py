"""Split CSV / TSV text into records with exact line accounting, strict about quotes (RFC 4180).

Why not pyarrow's CSV reader or Python's ``csv``: both are lenient about quotes, so one stray ``"``
silently swallows every line up to the next quote (merging reviews into one accepted row, or
collapsing hundreds of lines into one malformed row), and pyarrow fails a whole file on a value
longer than its block size. Measured in ``benchmarks/csv_readers.py``.

The grammar: a field is either quoted (``"..."`` with inner quotes doubled, newlines allowed) or
unquoted (no quote character and no newline in it); fields are separated by the delimiter and a
record ends at ``\\n`` / ``\\r\\n`` / a bare ``\\r`` / end of file, decided per record (one file may
mix all three, ``cat`` of Windows, Unix and classic-Mac exports): a line end inside quotes is
the field's text, and a bare CR ends a record only where the record is complete (after its last
field; a bare CR in an earlier field is text, as in any reader). A bare CR that ends a record
counts as a line end in the line numbers. A record that breaks the grammar costs exactly
its first physical line: that line is reported (line number, bounded raw prefix, what broke) and
parsing resumes on the next line, so the records after a stray quote are read normally. A record
that parses but has the wrong number of fields is reported whole (its boundaries are sound).
Every physical line ends up in exactly one of: the header, a record, a reported bad record, or
a blank line; :func:`split_records` checks that sum against ``text.count("\\n")``.

Record boundaries are never guessed: a record equal to the header (``cat a.csv b.csv``) is reported
as ``header_row``; two neighbouring records whose field counts add up to the header's, one of them
short, the second not opening a quote (``first half<LF>second half,1`` among CRLF records), may be
one review broken by a line end inside a field written without quotes, where the line end between
them is unlike those around it, so both are reported as ``ambiguous_line_end`` with their raw text
rather than published as a fragment: a short first half where the line end on either side of it
differs (one file may switch line ends at every record), a complete first half (a label-first
layout) where both do. Records that are complete on both sides of any line end are never paired,
so a file that switches line ends (``cat windows.csv unix.csv``, or from record to record) costs
nothing; a file with one line end throughout has no line end to tell a break by.

Streaming (a file too large for memory, :func:`finetune_assets.core.sources.iter_file`): the text
comes in blocks; ``split_records(block, final=False)`` stops before the first record that may
continue in the next block and says where (``consumed``); the caller prepends the rest to the next
block and passes the result as ``after``, so the header, record numbers and line numbers continue
exactly as in a whole-file read.
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
    reason: str = (
        "malformed_row"  # the quarantine reason: malformed_row / header_row / ambiguous_line_end
    )


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


def _field_pattern(delimiter: str, escapechar: str | None = None) -> re.Pattern:
    d = re.escape(delimiter)
    # quoted (unrolled loop: fast on megabyte values, no recursion), else unquoted (possibly empty)
    if escapechar is None:
        return re.compile(rf'"([^"]*(?:""[^"]*)*)"|([^"{d}\n\r]*)')
    e = re.escape(escapechar)  # the escape character keeps the next one, whatever it is
    return re.compile(
        rf'"([^"{e}]*(?:(?:{e}.|"")[^"{e}]*)*)"|([^"{d}\n\r{e}]*(?:{e}.[^"{d}\n\r{e}]*)*)',
        re.DOTALL,
    )


def _plain_pattern(delimiter: str, escapechar: str | None = None) -> re.Pattern:
    """The rest of an unquoted field after a bare CR that is its text."""
    d = re.escape(delimiter)
    if escapechar is None:
        return re.compile(rf'[^"{d}\n\r]*')
    e = re.escape(escapechar)
    return re.compile(rf'[^"{d}\n\r{e}]*(?:{e}.[^"{d}\n\r{e}]*)*', re.DOTALL)


def _unescape(value: str, escapechar: str) -> str:
    """A field as Python's ``csv`` reads it with ``escapechar`` (and doubled quotes) set."""
    if escapechar not in value and '""' not in value:
        return value
    e = re.escape(escapechar)
    return re.sub(rf'{e}(.)|""', lambda m: m.group(1) or '"', value, flags=re.DOTALL)


_BARE_CR = re.compile(r"\r(?!\n)")


def _bare_cr(text: str, pos: int, stop: int, delimiter: str, need: int) -> int:
    """Where a line without quotes (``pos`` to ``stop``, its LF / CRLF end excluded) ends at a bare
    CR: the first one after its ``need - 1``-th delimiter (the record is complete there), else -1.
    """
    cr = text.find("\r", pos, stop)
    if cr < 0:
        return -1
    if cr == pos:
        return cr  # a blank line
    at = pos
    for _ in range(need - 1):
        at = text.find(delimiter, at, stop)
        if at < 0:
            return -1
        at += 1
    return text.find("\r", at, stop)


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
    if escapechar is not None and not quoting:
        raise ValueError("an escape character needs quoting (minimal)")
    match = _field_pattern(delimiter, escapechar).match
    plain_match = _plain_pattern(delimiter, escapechar).match
    cr_ends = after.cr_ends if after is not None else 0
    last_cr = False  # the text's last character is a CR counted as a record end
    bare = _BARE_CR.search(text) is not None  # else no record ends at a bare CR: not looked for
    n = len(text)
    pos = 0
    line = after.next_line if after is not None else 1
    record_no = after.next_record if after is not None else 0
    first_line = line
    header_key = None
    out: Records | None = None
    blank = ncols = 0
    if after is not None and after.header:
        out = Records(
            header=after.header,
            header_line=after.header_line,
            columns=[[] for _ in after.header],
            header_end_line=after.header_end_line,
            line_end=after.line_end,
            second=after.second,
        )
        ncols = len(after.header)
    while pos < n:
        start, start_line = pos, line
        problem = quoted = None
        stop = text.find("\n", pos)
        stop = n if stop < 0 else stop
        need = ncols if out is not None else 1  # a bare CR ends the header wherever it is
        if not quoting or (
            text.find('"', pos, stop) < 0
            and (escapechar is None or text.find(escapechar, pos, stop) < 0)
        ):  # a line without quotes (or escapes) is one record
            end = stop - 1 if stop > pos and text[stop - 1] == "\r" else stop
            cr = _bare_cr(text, pos, end, delimiter, need) if bare else -1
            if cr >= 0:  # ... or several, each ended by a bare CR
                end = stop = cr
            fields = text[pos:end].split(delimiter)
            pos = stop + 1
            open_end = stop == n or (cr == n - 1)  # a CR last: the next block may hold its LF
        else:
            fields, end, pos, problem, quoted, open_end = _parse_record(
                text, pos, delimiter, match, plain_match, need, escapechar
            )
            open_end = open_end or (problem is not None and stop == n)
            if problem is not None:  # resynchronise on the first line end, a bare CR included
                cr = text.find("\r", start, stop)
                if cr >= 0 and text[cr + 1 : cr + 2] != "\n" and cr + 1 < n:
                    stop = cr
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
            if out.held is not None and out.held.odd:  # broken after an odd line end: both go
                _ambiguous(out, out.held)
            out.held = None
            raw = text[start : stop - 1] if text[stop - 1 : stop] == "\r" else text[start:stop]
            out.bad.append(Bad(record_no, start_line, start_line, problem, raw[:RAW_PREFIX_CHARS]))
            record_no += 1
            if text[stop : stop + 1] == "\r":
                cr_ends += 1
                last_cr = stop == n - 1
            pos, line = stop + 1, start_line + 1
            continue
        end_line = start_line + text.count("\n", start, end)
        line = end_line + 1
        if bare and text[min(pos, n) - 1 : min(pos, n)] == "\r":  # a bare CR (or last) ended it
            cr_ends += 1
            last_cr = pos >= n
        if len(fields) == 1 and fields[0] == "" and not quoted:
            blank += 1
            continue
        term = _line_end(text, pos)
        if out is None:
            out = Records(header=fields, header_line=start_line, columns=[[] for _ in fields])
            out.header_end_line, out.line_end = end_line, term or ""
            ncols = len(fields)
            header_key = _header_key(fields)
            continue
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
                (held.fields < ncols and (held.odd or term != held.line_end))
                or (held.odd and term != held.line_end)
            )
        )
        out.second = False
        if second and held is not None:
            _ambiguous(out, held)
        odd = term is not None and out.line_end != "" and term != out.line_end
        if header_key is None:
            header_key = _header_key(out.header)
        if (
            len(fields) == ncols
            and len(fields[0]) < len(out.header[0]) + 8
            and _header_key(fields) == header_key
        ):
            out.bad.append(
                Bad(
                    record_no,
                    start_line,
                    end_line,
                    "the header row again (files concatenated?)",
                    text[start:end][:RAW_PREFIX_CHARS],
                    "header_row",
                )
            )
        elif second:
            out.bad.append(
                Bad(
                    record_no,
                    start_line,
                    end_line,
                    _SECOND,
                    text[start:end][:RAW_PREFIX_CHARS],
                    "ambiguous_line_end",
                )
            )
        elif len(fields) != ncols:
            out.bad.append(
                Bad(
                    record_no,
                    start_line,
                    end_line,
                    f"expected {ncols} fields, found {len(fields)}",
                    text[start:end][:RAW_PREFIX_CHARS],
                )
            )
        else:
            for col, value in zip(out.columns, fields):
                col.append(value)
            out.index.append(record_no)
            out.line.append(start_line)
            out.end_line.append(end_line)
        # only a short or odd record can pair with the next one (a complete one at a line end like
        # the one before it never does)
        if (
            (odd or len(fields) < ncols)
            and not quoted
            and not (
                out.bad and out.bad[-1].index == record_no and out.bad[-1].reason == "header_row"
            )
        ):
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
                cr_ends=cr_ends - (text[min(pos, n) - 1 : min(pos, n)] == "\r"),
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


_NAMES = {"\n": "LF", "\r\n": "CRLF", "\r": "CR"}
_SECOND = (
    "its fields and the record's before it add up to the header's: the two may be one review "
    "broken by a line end inside a field written without quotes"
)


def _line_end(text: str, pos: int) -> str | None:
    """The line end of a record whose next record starts at ``pos`` (None at the end of the
    text).
    """
    if pos > len(text) or text[pos - 1 : pos] not in ("\n", "\r"):
        return None
    if text[pos - 1] == "\r":
        return "\r"
    return "\r\n" if text[pos - 2 : pos - 1] == "\r" else "\n"


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


def _parse_record(
    text: str, pos: int, delimiter: str, match, plain_match, need: int, escapechar: str | None
) -> tuple[list[str], int, int, str | None, bool, bool]:
    """One record with quotes in it: (fields, end of its content, next position, problem, last field
    quoted, open end: the outcome depends on the end of ``text``, so more text could change it).
    A bare CR after its ``need``-th field ends it; in an earlier unquoted field it is text.
    """
    fields: list[str] = []
    while True:
        m = match(text, pos)
        quoted, plain = m.group(1), m.group(2)
        end = m.end()
        while (
            quoted is None
            and len(fields) + 1 < need
            and text[end : end + 1] == "\r"
            and text[end + 1 : end + 2] not in ("\n", "")
        ):  # a bare CR inside an unquoted field that is not the record's last
            more = plain_match(text, end + 1)
            plain, end = plain + "\r" + more.group(0), more.end()
        if escapechar is not None:
            fields.append(_unescape(plain if quoted is None else quoted, escapechar))
        else:
            fields.append(
                plain if quoted is None else quoted.replace('""', '"') if '"' in quoted else quoted
            )
        c = text[end : end + 1]
        if c == delimiter:
            pos = end + 1
            continue
        if c == "\n" or c == "":
            return fields, end, end + 1, None, quoted is not None, c == ""
        if c == "\r" and text[end + 1 : end + 2] in ("\n", ""):
            return fields, end, end + 2, None, quoted is not None, end + 2 > len(text)
        if c == "\r":  # a bare CR ends the record
            return fields, end, end + 1, None, quoted is not None, False
        k = len(fields)
        if quoted is None and plain == "":
            problem = f"field {k} opens a quote that is never closed"
        elif quoted is None:
            problem = (
                f"a quote inside unquoted field {k} (quote the whole field, doubling inner quotes)"
            )
        else:
            problem = (
                f"text after the closing quote of field {k} (an undoubled quote inside a quoted "
                "field, "
                "or a stray quote)"
            )
        # A quote after a quoted field, or a field opening a quote, means the quoted pattern found
        # no closing quote (it only backtracks after scanning to the end of the text): more text may
        # close it.
        return fields, end, end, problem, False, c == '"' and (quoted is not None or plain == "")


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
