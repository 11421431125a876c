"""``delta:PATH_OR_URL[@version=N|@timestamp=ISO]`` sources: a Delta Lake table through
``deltalake``.

Registration pins the exact table version (:func:`pin_delta` rewrites the URI to ``@version=N``), so
a dataset version reads the same rows forever (time travel), whatever was committed since. Only
the text and label columns (and those ``SourceSpec.where`` names) are read. The version's Parquet
files, from its add actions, are streamed one after another in record batches of about
``block_bytes``, each file through a small read buffer, so memory stays bounded whatever the
writer's row-group size; ``where`` (a SQL predicate, as in ``DeltaTable.delete``) skips files by
their partition values and statistics and filters each batch (:mod:`.delta_filter`). Versions the
streamed reader cannot read exactly (deletion vectors, column mapping, a predicate beyond the
translated subset) go through delta-rs' DataFusion engine instead (benchmarks/README.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from finetune_assets.data.sources.base import (
    BLOCK_BYTES,
    PARQUET_ROW_BYTES,
    SourceError,
    SourceSpec,
)
from finetune_assets.data.sources.columns import (
    TEXT_COLUMNS,
    pick_column,
    pick_label,
    renumber,
    text_columns,
    to_raw,
)
from finetune_assets.data.sources.delta_filter import to_expression

DELTA_PREFIX = "delta:"
# One DataFusion partition: files are scanned one after another in the snapshot's order, so one
# table version gives its rows in one order every time (several partitions interleave them by
# timing).
SESSION = {"datafusion.execution.target_partitions": "1"}
# Bytes of a column chunk the streamed reader holds at once (pyarrow's buffered stream).
READ_BUFFER = 1 << 20


class VersionGone(SourceError):
    """The table version's data files were vacuumed away: it can never be read again."""


@dataclass(frozen=True)
class DeltaRef:
    """A parsed ``delta:`` URI: the table, and at most one of a version or a timestamp."""

    table: str
    version: int | None = None
    timestamp: str | None = None

    def pinned(self, version: int) -> str:
        return f"{DELTA_PREFIX}{self.table}@version={version}"


def parse_delta(uri: str) -> DeltaRef:
    body = uri[len(DELTA_PREFIX) :]
    table, _, pin = (
        body.rpartition("@") if "@version=" in body or "@timestamp=" in body else (body, "", "")
    )
    if not table:
        raise SourceError(
            f"{uri}: no table path or URL (expected delta:PATH_OR_URL[@version=N|@timestamp=ISO])"
        )
    if pin.startswith("version="):
        try:
            version = int(pin[len("version=") :])
        except ValueError:
            version = -1
        if version < 0:
            raise SourceError(f"{uri}: @version must be a table version number (0, 1, 2 ...)")
        return DeltaRef(table, version=version)
    if pin.startswith("timestamp="):
        return DeltaRef(table, timestamp=pin[len("timestamp=") :])
    return DeltaRef(table)


def open_table(uri: str):
    """The ``DeltaTable`` at the URI's version (latest without one); a failure is one line."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    ref = parse_delta(uri)
    try:
        table = DeltaTable(ref.table, version=ref.version)
        if ref.timestamp is not None:
            table.load_as_version(ref.timestamp)
    except TableNotFoundError:
        raise SourceError(
            f"{uri}: no Delta table at {ref.table} (no _delta_log there; check the path or URL)"
        ) from None
    except Exception as err:  # noqa: BLE001 - plain errors: bad URLs, versions, credentials
        raise SourceError(
            f"{uri}: cannot open the Delta table{_latest_hint(ref)}: {_first_line(err)}"
        ) from None
    return table


def _latest_hint(ref: DeltaRef) -> str:
    """For a pinned version the table does not (or no longer) hold: which versions it has."""
    if ref.version is None and ref.timestamp is None:
        return ""
    from deltalake import DeltaTable

    try:
        return (
            f" at the requested version (its latest version is {DeltaTable(ref.table).version()})"
        )
    except Exception:  # noqa: BLE001 - the table itself cannot be opened: the error says why
        return ""


def pin_delta(spec: SourceSpec) -> SourceSpec:
    """The spec at the exact table version that ``@timestamp`` or "latest" means now."""
    return replace(spec, uri=parse_delta(spec.uri).pinned(open_table(spec.uri).version()))


def describe_delta(spec: SourceSpec) -> dict:
    """Which table version is read, and the latest one (time travel is said, not silent)."""
    ref = parse_delta(spec.uri)
    latest = open_table(DELTA_PREFIX + ref.table).version()
    return {"delta_table": ref.table, "delta_version": ref.version, "delta_latest_version": latest}


def _columns(table, spec: SourceSpec) -> list[str]:
    """The columns holding the text and the label, picked by name from the schema as for files."""
    empty = pa.schema(table.schema().to_arrow()).empty_table()
    wanted = spec.text_column
    if wanted is not None and "," in wanted and wanted not in empty.column_names:
        texts = [
            pick_column(empty, w.strip(), TEXT_COLUMNS, "text", spec.uri)
            for w in wanted.split(",")
            if w.strip()
        ]
    else:
        texts = [pick_column(empty, wanted, TEXT_COLUMNS, "text", spec.uri)]
    return list(dict.fromkeys([*texts, pick_label(empty, spec, spec.uri, required=True)]))


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def iter_delta(spec: SourceSpec, block_bytes: int = BLOCK_BYTES) -> Iterator[pa.Table]:
    """The pinned table version's rows as :data:`RAW_SCHEMA` tables of about ``block_bytes``
    each.
    """
    table = open_table(spec.uri)
    columns = _columns(table, spec)
    rows = max(1, block_bytes // PARQUET_ROW_BYTES)
    try:
        batches = _streamed(table, spec, columns, rows)
        if batches is None:  # deletion vectors, column mapping, a predicate beyond the subset
            batches = _engine(table, spec, columns, rows)
        row = 0
        for batch in batches:
            part = _plain_strings(pa.Table.from_batches([batch]))
            part, text_col = text_columns(part, spec.text_column, spec.uri)
            raw = to_raw(part, text_col, pick_label(part, spec, spec.uri, required=True), spec.uri)
            yield renumber(raw, row)
            row += raw.num_rows
    except SourceError:
        raise
    except Exception as err:  # noqa: BLE001 - a bad predicate, a vacuumed file, a lost connection
        problem = _read_problem(spec, err)
        raise (VersionGone if "vacuumed" in problem else SourceError)(
            f"{spec.uri}: {problem}"
        ) from None


def _streamed(table, spec: SourceSpec, columns: list[str], rows: int):
    """The add-actions' Parquet files, each streamed in ``rows``-row batches, or None where only
    DataFusion can read the version.

    ``ParquetFile.iter_batches`` decodes ``rows`` rows at a time and, with a read buffer and no
    pre-buffering, holds ``READ_BUFFER`` bytes of a column chunk, not the chunk: Spark and
    Databricks write ~128 MB row groups (delta-rs up to ~1M rows), which DataFusion's scan would
    fetch whole. Files come in the snapshot's order, one after another, so a version's rows keep
    one order.
    """
    from deltalake.exceptions import DeltaError, DeltaProtocolError

    schema = pa.schema(table.schema().to_arrow())
    where = to_expression(spec.where, schema) if spec.where else None
    if spec.where and where is None:
        return None
    try:  # files skipped by their partition values and statistics
        dataset = table.to_pyarrow_dataset(file_pruning_predicate=spec.where or None)
    except DeltaProtocolError:  # the dataset refuses deletion vectors and column mapping
        return None
    except DeltaError:  # a predicate delta-rs cannot skip files with (LIKE): rows filtered only
        dataset = table.to_pyarrow_dataset()
    partitioned = set(table.metadata().partition_columns)
    wanted = list(dict.fromkeys([*columns, *(where[1] if where else ())]))
    return _file_batches(
        table.table_uri.rstrip("/"),
        dataset,
        schema,
        partitioned,
        wanted,
        where and where[0],
        columns,
        rows,
    )


def _file_batches(root, dataset, schema, partitioned, wanted, where, columns, rows):
    import pyarrow.dataset as pds  # imported when a table is read: it costs ~30 MB

    for fragment in dataset.get_fragments():
        keys = pds.get_partition_keys(fragment.partition_expression)
        in_file = [c for c in wanted if c not in partitioned]
        with fsspec.open(f"{root}/{fragment.path}", "rb") as f:
            parquet = pq.ParquetFile(f, buffer_size=READ_BUFFER, pre_buffer=False)
            present = set(parquet.schema_arrow.names)
            for batch in parquet.iter_batches(
                batch_size=rows, columns=[c for c in in_file if c in present], use_threads=False
            ):
                arrays = [
                    _column(batch, schema.field(c), keys.get(c) if c in partitioned else None)
                    for c in wanted
                ]
                part = pa.Table.from_arrays(arrays, names=wanted)
                if where is not None:
                    part = part.filter(where)
                if part.num_rows:
                    yield from part.select(columns).to_batches()


def _column(batch: pa.RecordBatch, field: pa.Field, partition_value) -> pa.Array:
    """A column as the table's schema types it: a partition column is its file's value, and a
    column the file predates (added since) is null.
    """
    if field.name in batch.schema.names:
        array = batch.column(field.name)
        return array if array.type == field.type else array.cast(field.type)
    return pa.repeat(pa.scalar(partition_value, field.type), batch.num_rows)


def _engine(table, spec: SourceSpec, columns: list[str], rows: int) -> Iterator[pa.RecordBatch]:
    """DataFusion's scan (deletion vectors, column mapping, any SQL predicate): it holds a row
    group's column chunks, so the writer's row-group size bounds its memory.
    """
    from deltalake import QueryBuilder

    sql = f"SELECT {', '.join(map(_quoted, columns))} FROM src" + (
        f" WHERE {spec.where}" if spec.where else ""
    )
    qb = QueryBuilder({**SESSION, "datafusion.execution.batch_size": str(rows)}).register(
        "src", table
    )
    for batch in pa.RecordBatchReader.from_stream(qb.execute(sql)):
        for start in range(0, batch.num_rows, rows):  # DataFusion may hand a file's rows at once
            yield batch.slice(start, rows)


def _plain_strings(table: pa.Table) -> pa.Table:
    """DataFusion hands strings as ``string_view``: as plain strings (and binaries), like every
    other reader.
    """
    views = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    if not any(f.type in views for f in table.schema):
        return table
    return table.cast(pa.schema([f.with_type(views.get(f.type, f.type)) for f in table.schema]))


def _read_problem(spec: SourceSpec, err: Exception) -> str:
    text, full = _first_line(err), str(err).lower()
    if "not found" in full or "no such file" in full:
        return (
            f"a data file of this table version is gone (vacuumed?): {text}; the version cannot "
            "be read again: register a version the table still holds"
        )
    if spec.where and any(
        w in text for w in ("Schema error", "SQL error", "sql parser", "evaluating filter")
    ):
        return f"row filter (--where) {spec.where!r} cannot be evaluated: {text}"
    return f"cannot read the Delta table: {text}"


def check_delta(spec: SourceSpec, sample_bytes: int) -> dict[str, int]:
    """The table version opens, its columns are found and the filter parses: the first batch is
    read.
    """
    first = next(iter_delta(spec, block_bytes=max(PARQUET_ROW_BYTES, sample_bytes)), None)
    return {spec.uri: 0 if first is None else first.column("malformed").null_count}


def _first_line(err: Exception) -> str:
    """The first lines of a delta-rs error, without its terminal colours."""
    lines = [
        ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(err)).splitlines() if ln.strip()
    ]
    return " ".join(lines[:2])[:400] if lines else type(err).__name__
