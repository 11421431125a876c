"""Read one dataset version from its source into a raw table, naming the file and the problem on
failure.

A source is a file or folder of CSV / TSV / JSONL / Parquet (local path or fsspec URL), a Hugging
Face dataset id (``hf:owner/name``), a built-in set (``builtin:rotten_tomatoes``,
``builtin:sample``: :mod:`finetune_assets.core.sources.builtin_sets`), a Delta table
(``delta:PATH_OR_URL[@version=N]``, :mod:`.tables.delta`), an Iceberg table (``iceberg:``,
:mod:`.tables.iceberg`) or a SQL table or query (``sql:ENV_NAME``, :mod:`.tables.sql`);
:mod:`.families` maps a source's prefix to its reader. Every record read is kept:
records the parser cannot use are returned too, flagged ``malformed`` (with their lines and raw
text), so that validation can quarantine them and the counts always add up. :func:`read_file` is the
one reader for any input file (sources, ``predict``, evaluation sets).

Modules: :mod:`.base` (spec, raw schema, error), :mod:`.listing` (files of a folder, ignore rules),
:mod:`.decoding` (decompression, text decoding), :mod:`.columns` (text/label columns),
:mod:`.files`, :mod:`.delimited` (the strict CSV / TSV splitter) and :mod:`.jsonl` (file readers),
:mod:`.hf`, :mod:`.builtin`, :mod:`.tables` (Delta, Iceberg, SQL), :mod:`.families`.
"""

# what callers outside the package read (the read-size knobs stay in .base)
from finetune_assets.core.sources.base import (
    HEAD_BYTES,
    MAX_RECORD_BLOCKS,
    RAW_SCHEMA,
    SourceError,
    SourceSpec,
)
from finetune_assets.core.sources.builtin_sets import is_builtin
from finetune_assets.core.sources.columns import LABEL_COLUMNS, TEXT_COLUMNS, TEXT_JOIN
from finetune_assets.core.sources.decoding import decode, read_bytes
from finetune_assets.core.sources.families import (
    check_source,
    describe_source,
    is_file_source,
    iter_source,
    pin_source,
    read_source,
)
from finetune_assets.core.sources.files import iter_file, read_file
from finetune_assets.core.sources.hf import HF_PREFIX
from finetune_assets.core.sources.listing import (
    ARCHIVES,
    COMPRESSIONS,
    FORMATS,
    Listing,
    file_format,
    ignored_because,
    list_files,
    list_source,
)
from finetune_assets.core.sources.tables.delta import DELTA_PREFIX
from finetune_assets.core.sources.tables.iceberg import ICEBERG_PREFIX
from finetune_assets.core.sources.tables.sql import SQL_PREFIX

__all__ = [
    "ARCHIVES",
    "COMPRESSIONS",
    "DELTA_PREFIX",
    "FORMATS",
    "HEAD_BYTES",
    "HF_PREFIX",
    "LABEL_COLUMNS",
    "MAX_RECORD_BLOCKS",
    "RAW_SCHEMA",
    "ICEBERG_PREFIX",
    "SQL_PREFIX",
    "TEXT_COLUMNS",
    "TEXT_JOIN",
    "Listing",
    "SourceError",
    "SourceSpec",
    "check_source",
    "decode",
    "describe_source",
    "file_format",
    "ignored_because",
    "is_builtin",
    "is_file_source",
    "iter_file",
    "iter_source",
    "list_files",
    "list_source",
    "pin_source",
    "read_bytes",
    "read_file",
    "read_source",
]
