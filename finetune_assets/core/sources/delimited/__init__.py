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

Modules: :mod:`.grammar` (one record's fields: where it ends, what broke), :mod:`.placement` (what
a record is: good, bad, held), :mod:`.split` (:func:`split_records`: the loop over a block and the
line accounting) and :mod:`.records` (what it returns).
"""

from finetune_assets.core.sources.delimited.records import (
    RAW_PREFIX_CHARS,
    Bad,
    HeaderError,
    Records,
    RecordTooLong,
)
from finetune_assets.core.sources.delimited.split import split_records

__all__ = ["RAW_PREFIX_CHARS", "Bad", "HeaderError", "RecordTooLong", "Records", "split_records"]
