"""What every source family shares: the spec of a source, the raw table it becomes, its error,
block sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# Streaming (bounded memory): a file is read in blocks of this many (decompressed) input bytes, so
# one huge file costs a block, not the file. The first block is at least HEAD_BYTES (the encoding
# checks); a record still open after MAX_RECORD_BLOCKS blocks is not carried further (split_records'
# max_record); Parquet batches hold block / PARQUET_ROW_BYTES rows (about a review's size).
BLOCK_BYTES = 16 << 20  # parsed rows cost ~10x their bytes in Python objects: ~160 MB peak
HEAD_BYTES = 4096
MAX_RECORD_BLOCKS = 4  # 64 MiB: far above any review, and a stray quote costs at most 4 rescans
PARQUET_ROW_BYTES = 1024

# Columns of the raw table handed to validation.
RAW_SCHEMA = pa.schema(
    [
        ("text", pa.string()),
        ("label", pa.string()),
        ("source_file", pa.string()),
        ("source_row", pa.int64()),  # record number in its file (0-based, bad records included)
        ("malformed", pa.string()),  # why the reader could not use the row (None: a good row)
        ("malformed_reason", pa.string()),  # the quarantine reason for it: malformed_row / non_text
        # first physical line (CSV/TSV/JSONL, 1-based; None for Parquet)
        (
            "source_line",
            pa.int64(),
        ),
        ("source_line_end", pa.int64()),
        ("raw", pa.string()),  # a bad record's raw text, first RAW_PREFIX_CHARS characters
    ]
)


class SourceError(ValueError):
    """A source that cannot be read: the message names the file and what is wrong."""


@dataclass(frozen=True)
class SourceSpec:
    uri: str
    revision: str | None = None  # Hugging Face dataset revision
    hf_split: str = "train"
    text_column: str | None = (
        None  # None: first of TEXT_COLUMNS present; "title,body": joined (TEXT_JOIN)
    )
    label_column: str | None = None  # None: first of LABEL_COLUMNS present
    encoding: str = "utf-8"
    where: str | None = None  # delta: / sql: row filter (SQL predicate), part of the version
    query: str | None = None  # sql: a table name or a SELECT statement
    snapshot: str | None = None  # sql: what registration read (content hash, snapshot marker)
    # delta: options for delta-rs' storage (AWS_REGION, AZURE_STORAGE_ACCOUNT_NAME, ...); a value
    # "env:NAME" is read from the environment at each read, so secrets are never recorded
    storage_options: dict[str, str] | None = None
    # CSV/TSV: the field delimiter (None: tab for .tsv, sniffed from a .csv header among , ; tab |;
    # a sniffed one other than the comma is recorded at registration)
    delimiter: str | None = None
    quoting: str = "minimal"  # CSV/TSV: "none" for exports that never quote (a '"' is a character)
    escapechar: str | None = None  # CSV/TSV: keeps the next character as text (``\\"`` a quote)
