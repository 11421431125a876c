"""One record of CSV / TSV text read by the strict grammar of
:mod:`finetune_assets.core.sources.delimited` (RFC 4180 quoting, an optional escape character, any
mix of LF, CRLF and bare-CR record ends).

:meth:`Grammar.scan` reads the record starting at a position and says where it ends, what broke
(if anything) and whether more text could change the outcome; :func:`.records.split_records`
decides what the record is (the header, a good row, a quarantined one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# a CR that is not the first half of a CRLF: a record may end there
BARE_CR = re.compile(r"\r(?!\n)")


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


def line_end(text: str, pos: int) -> str | None:
    """The line end of a record whose next record starts at ``pos`` (None at the end of the
    text).
    """
    if pos > len(text) or text[pos - 1 : pos] not in ("\n", "\r"):
        return None
    if text[pos - 1] == "\r":
        return "\r"
    return "\r\n" if text[pos - 2 : pos - 1] == "\r" else "\n"


# What Grammar.scan returns, a plain tuple (one per record):
# (fields, end of its content (its line end excluded), end of its first physical line (all a broken
# record gives up), where the next record starts, what broke the grammar (None: it parsed), its
# last field was quoted, open end: the outcome depends on the end of the text)
Scanned = tuple[list[str], int, int, int, str | None, bool | None, bool]


@dataclass(frozen=True)
class Grammar:
    """The delimiter, quoting and escape rules of one file, and their compiled field patterns."""

    delimiter: str
    quoting: bool
    escapechar: str | None
    field: re.Pattern
    plain: re.Pattern

    @classmethod
    def of(cls, delimiter: str, quoting: bool = True, escapechar: str | None = None) -> Grammar:
        if escapechar is not None and not quoting:
            raise ValueError("an escape character needs quoting (minimal)")
        return cls(
            delimiter,
            quoting,
            escapechar,
            _field_pattern(delimiter, escapechar),
            _plain_pattern(delimiter, escapechar),
        )

    def scan(self, text: str, pos: int, need: int, bare: bool) -> Scanned:
        """The record starting at ``pos``, complete after ``need`` fields (where a bare CR ends it);
        ``bare``: the text has a bare CR at all (else none is looked for).
        """
        n = len(text)
        stop = text.find("\n", pos)
        stop = n if stop < 0 else stop
        esc = self.escapechar
        if not self.quoting or (
            text.find('"', pos, stop) < 0 and (esc is None or text.find(esc, pos, stop) < 0)
        ):  # a line without quotes (or escapes) is one record
            end = stop - 1 if stop > pos and text[stop - 1] == "\r" else stop
            cr = _bare_cr(text, pos, end, self.delimiter, need) if bare else -1
            if cr >= 0:  # ... or several, each ended by a bare CR
                end = stop = cr
            fields = text[pos:end].split(self.delimiter)
            # a CR last: the next block may hold its LF
            return fields, end, stop, stop + 1, None, None, stop == n or (cr == n - 1)
        fields, end, nxt, problem, quoted, open_end = self._parse_quoted(text, pos, need)
        open_end = open_end or (problem is not None and stop == n)
        if problem is not None:  # resynchronise on the first line end, a bare CR included
            cr = text.find("\r", pos, stop)
            if cr >= 0 and text[cr + 1 : cr + 2] != "\n" and cr + 1 < n:
                stop = cr
        return fields, end, stop, nxt, problem, quoted, open_end

    def _parse_quoted(
        self, text: str, pos: int, need: int
    ) -> tuple[list[str], int, int, str | None, bool, bool]:
        """One record with quotes in it: (fields, end of its content, next position, problem, last
        field quoted, open end: the outcome depends on the end of ``text``, so more text could
        change it). A bare CR after its ``need``-th field ends it; in an earlier unquoted field it
        is text.
        """
        match, plain_match, delimiter, escapechar = (
            self.field.match,
            self.plain.match,
            self.delimiter,
            self.escapechar,
        )
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
                    plain
                    if quoted is None
                    else quoted.replace('""', '"')
                    if '"' in quoted
                    else quoted
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
            # A quote after a quoted field, or a field opening a quote, means the quoted pattern
            # found no closing quote (it only backtracks after scanning to the end of the text):
            # more text may close it.
            may_close = c == '"' and (quoted is not None or plain == "")
            return fields, end, end, _broken(len(fields), quoted, plain), False, may_close


def _broken(k: int, quoted: str | None, plain: str) -> str:
    """What broke field ``k`` (a quote where the grammar allows none)."""
    if quoted is None and plain == "":
        return f"field {k} opens a quote that is never closed"
    if quoted is None:
        return f"a quote inside unquoted field {k} (quote the whole field, doubling inner quotes)"
    return (
        f"text after the closing quote of field {k} (an undoubled quote inside a quoted field, "
        "or a stray quote)"
    )
