"""Which reader reads a source: a prefix names its family (``hf:``, ``builtin:``, ``delta:``,
``sql:``, ``iceberg:``); anything else is a file, a folder or an fsspec URL of them. Every family
yields :data:`RAW_SCHEMA` blocks, so all of them go through the same intake (labels, validation,
quarantine, duplicates, splits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from finetune_assets.core.sources.base import BLOCK_BYTES, RAW_SCHEMA, SourceSpec
from finetune_assets.core.sources.builtin import check_builtin_source, iter_builtin
from finetune_assets.core.sources.builtin_sets import BUILTIN_PREFIX
from finetune_assets.core.sources.files import check_files, iter_files, pin_files
from finetune_assets.core.sources.hf import HF_PREFIX, check_hf, describe_hf, iter_hf, pin_hf
from finetune_assets.core.sources.tables.delta import (
    DELTA_PREFIX,
    check_delta,
    describe_delta,
    iter_delta,
    pin_delta,
)
from finetune_assets.core.sources.tables.iceberg import (
    ICEBERG_PREFIX,
    check_iceberg,
    describe_iceberg,
    iter_iceberg,
    pin_iceberg,
)
from finetune_assets.core.sources.tables.sql import (
    SQL_PREFIX,
    check_sql,
    describe_sql,
    iter_sql,
    pin_sql,
)


@dataclass(frozen=True)
class Family:
    """One kind of source: how its rows stream (bounded blocks of :data:`RAW_SCHEMA`), and how
    registration checks it without reading it all (returns the sampled good rows per file, where it
    samples).
    """

    prefix: str
    iter: Callable[[SourceSpec, int], Iterator[pa.Table]]
    check: Callable[[SourceSpec, int], dict[str, int]]
    # registration: the spec that names exactly what is read now (a Delta version, a SQL content
    # hash)
    pin: Callable[[SourceSpec], SourceSpec] = field(default=lambda spec: spec)
    # materialization: what is read, for the run's log and metadata (never credentials)
    describe: Callable[[SourceSpec], dict] = field(default=lambda spec: {})


FILES = Family("", iter_files, check_files, pin_files)
FAMILIES = (
    Family(BUILTIN_PREFIX, iter_builtin, check_builtin_source),
    Family(HF_PREFIX, iter_hf, check_hf, pin_hf, describe_hf),
    Family(DELTA_PREFIX, iter_delta, check_delta, pin_delta, describe_delta),
    Family(SQL_PREFIX, iter_sql, check_sql, pin_sql, describe_sql),
    Family(ICEBERG_PREFIX, iter_iceberg, check_iceberg, pin_iceberg, describe_iceberg),
)


def family_of(uri: str) -> Family:
    return next((f for f in FAMILIES if uri.startswith(f.prefix)), FILES)


def is_file_source(uri: str) -> bool:
    """Files or a folder (listed, fingerprinted from the listing), not a table, a dataset id or a
    set.
    """
    return family_of(uri) is FILES


def pin_source(spec: SourceSpec) -> SourceSpec:
    return family_of(spec.uri).pin(spec)


def describe_source(spec: SourceSpec) -> dict:
    return family_of(spec.uri).describe(spec)


def read_source(spec: SourceSpec) -> pa.Table:
    """All rows of a source as :data:`RAW_SCHEMA` (labels as strings, exactly as found)."""
    tables = list(iter_source(spec))
    return pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()


def iter_source(spec: SourceSpec, block_bytes: int = BLOCK_BYTES) -> Iterator[pa.Table]:
    """The rows of a source in bounded blocks (file order of :func:`list_files`), as
    :data:`RAW_SCHEMA`.

    Each file is streamed (:func:`iter_file`), so memory is bounded by ``block_bytes``, not by the
    largest file: a version that is one 5 GB CSV reads like one of many small files.
    """
    yield from family_of(spec.uri).iter(spec, block_bytes)


def check_source(spec: SourceSpec, sample_bytes: int = 1 << 20) -> dict[str, int]:
    """Fail now, not at materialization: every file (or the table) opens, its columns are found and
    a sample parses.

    Returns the sampled good rows per file. Hugging Face ids are resolved to a commit by
    :func:`pin_source`, not read here; a built-in set is only located (its package installed, its
    name known).
    """
    return family_of(spec.uri).check(spec, sample_bytes)
