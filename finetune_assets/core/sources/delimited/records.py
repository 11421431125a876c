"""What :func:`~.split.split_records` returns: the header, the good rows column-wise, the bad
records with their lines and raw text, and where the next block goes on.
"""

from __future__ import annotations

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
    # the quarantine reason: malformed_row / header_row / ambiguous_line_end
    reason: str = "malformed_row"


@dataclass(frozen=True)
class Held:
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
    held: Held | None = None  # the last record, when its line end differs from the one before it
    second: bool = False  # the first record of the text was paired with the one before it
    cr_ends: int = 0  # bare CRs taken as record ends so far (line ends the LF count misses)

    @property
    def records(self) -> int:
        return len(self.index) + len(self.bad)


class HeaderError(ValueError):
    """The header line itself cannot be parsed."""


class RecordTooLong(ValueError):
    """Streaming: one physical line longer than ``max_record`` (no line end to resynchronise on)."""


# Where a parsed record stands: (start, end of its content) in the text, its first and last
# physical line, its record number. A plain tuple: one is made for every record.
Span = tuple[int, int, int, int, int]
