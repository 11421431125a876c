"""``iceberg:CATALOG_URI#[CATALOG_NAME/]NAMESPACE.TABLE[@snapshot=ID]`` sources: an Apache Iceberg
table through ``pyiceberg``.

The catalog is found by its URI (``sqlite:///…`` / ``postgresql://…`` for a SQL catalog,
``http(s)://…`` for a REST catalog, ``thrift://…`` for Hive; pyiceberg infers which), the table by
its dotted name; the catalog's name (a SQL catalog keys its tables by it) is ``default`` unless
given. Registration pins the table's current snapshot (:func:`pin_iceberg` rewrites the
URI to ``@snapshot=ID``), so a dataset version reads the same rows forever, whatever is appended or
deleted since (Iceberg snapshots are immutable until expired). ``SourceSpec.where`` is parsed by
pyiceberg's own expression parser and bound to the table's schema (a bad column or type is refused
at registration), then pushed into the scan, never spliced into text. Rows stream as pyiceberg's
record batches, one data file at a time, sliced to about ``block_bytes``, so memory is
bounded by one data file's batches, not by the table.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import pyarrow as pa

from finetune_assets.core.sources.base import (
    BLOCK_BYTES,
    PARQUET_ROW_BYTES,
    SourceError,
    SourceSpec,
)
from finetune_assets.core.sources.columns import raw_block, source_columns
from finetune_assets.core.sources.tables.delta import storage_options

ICEBERG_PREFIX = "iceberg:"
_SNAPSHOT = "@snapshot="


@dataclass(frozen=True)
class IcebergRef:
    """A parsed ``iceberg:`` URI: the catalog's URI, the table's dotted name, maybe a snapshot."""

    catalog: str
    table: str
    snapshot: int | None = None
    name: str = "default"  # the catalog's name

    def pinned(self, snapshot: int) -> str:
        name = "" if self.name == "default" else f"{self.name}/"
        return f"{ICEBERG_PREFIX}{self.catalog}#{name}{self.table}{_SNAPSHOT}{snapshot}"


def parse_iceberg(uri: str) -> IcebergRef:
    body = uri[len(ICEBERG_PREFIX) :]
    snapshot = None
    if _SNAPSHOT in body:
        body, _, sid = body.rpartition(_SNAPSHOT)
        if not sid.isdigit():
            raise SourceError(f"{uri}: @snapshot= takes a snapshot id (an integer), got {sid!r}")
        snapshot = int(sid)
    catalog, sep, table = body.rpartition("#")
    name, _, table = table.rpartition("/")
    if not sep or not catalog or "." not in table:
        raise SourceError(
            f"{uri}: expected iceberg:CATALOG_URI#[CATALOG_NAME/]NAMESPACE.TABLE[@snapshot=ID], "
            "e.g. iceberg:sqlite:////data/catalog.db#reviews.amazon"
        )
    return IcebergRef(catalog, table, snapshot, name or "default")


def open_table(uri: str, options: dict[str, str] | None = None):
    """The catalog's table (catalog properties: its URI and the spec's storage options)."""
    # lazy, as every pyiceberg import here: the code location imports every source family; a
    # family's library loads when it is read
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    ref = parse_iceberg(uri)
    try:
        catalog = load_catalog(ref.name, uri=ref.catalog, **(storage_options(options) or {}))
        return ref, catalog.load_table(ref.table)
    except NoSuchTableError:
        raise SourceError(f"{uri}: no table {ref.table!r} in the catalog") from None
    except Exception as err:  # an unknown catalog kind, an unreachable catalog
        raise SourceError(f"{uri}: cannot open the Iceberg catalog: {_first_line(err)}") from None


def pin_iceberg(spec: SourceSpec) -> SourceSpec:
    """The spec at the table's current snapshot (where it names none)."""
    ref, table = open_table(spec.uri, spec.storage_options)
    if ref.snapshot is not None:
        return spec
    current = table.current_snapshot()
    if current is None:
        raise SourceError(f"{spec.uri}: the table has no snapshot yet (nothing to register)")
    return replace(spec, uri=ref.pinned(current.snapshot_id))


def describe_iceberg(spec: SourceSpec) -> dict:
    ref = parse_iceberg(spec.uri)
    return {"iceberg_table": ref.table, "iceberg_snapshot": ref.snapshot}


def _row_filter(spec: SourceSpec, schema):
    """``--where`` as a pyiceberg expression bound to the table's schema (refused if it is not)."""
    if not spec.where:
        return None, []
    from pyiceberg.expressions import parser  # lazy: see open_table
    from pyiceberg.expressions.visitors import bind, extract_field_ids

    try:
        expr = parser.parse(spec.where)
        bound = bind(schema, expr, case_sensitive=True)
    except Exception as err:  # a parse error, an unknown column, a wrong type
        raise SourceError(
            f"{spec.uri}: row filter (--where) {spec.where!r} cannot be used: {_first_line(err)}"
        ) from None
    return expr, [schema.find_column_name(i) for i in extract_field_ids(bound)]


def iter_iceberg(spec: SourceSpec, block_bytes: int = BLOCK_BYTES) -> Iterator[pa.Table]:
    """The pinned snapshot's rows (filtered) as :data:`RAW_SCHEMA` tables of about
    ``block_bytes``.
    """
    ref, table = open_table(spec.uri, spec.storage_options)
    snapshot = ref.snapshot
    if snapshot is None:
        current = table.current_snapshot()
        snapshot = None if current is None else current.snapshot_id
    elif table.snapshot_by_id(snapshot) is None:
        raise SourceError(
            f"{spec.uri}: snapshot {snapshot} is gone (expired): the version cannot be read "
            "again; register a snapshot the table still holds"
        )
    schema = table.schema() if ref.snapshot is None else _schema_at(table, snapshot)
    columns = source_columns(schema.as_arrow(), spec)
    row_filter, read = _row_filter(spec, schema)
    if snapshot is None:
        return
    rows = max(1, block_bytes // PARQUET_ROW_BYTES)
    scan = table.scan(
        selected_fields=tuple(dict.fromkeys([*columns, *read])),
        snapshot_id=snapshot,
        **({"row_filter": row_filter} if row_filter is not None else {}),
    )
    row = 0
    try:
        for batch in _batches(scan):
            for start in range(0, batch.num_rows, rows):
                part = pa.Table.from_batches([batch.slice(start, rows)]).select(columns)
                raw = raw_block(part, spec, row)
                yield raw
                row += raw.num_rows
    except SourceError:
        raise
    except Exception as err:  # a missing data file, a lost connection
        raise SourceError(
            f"{spec.uri}: cannot read the Iceberg table: {_first_line(err)}"
        ) from None


def _batches(scan) -> Iterator[pa.RecordBatch]:
    """The scan's record batches one data file at a time: pyiceberg's own batch reader maps every
    file of the scan onto its thread pool at once, each file's batches held until read, so a big
    table would be in memory; here one file's batches are.
    """
    from pyiceberg.io.pyarrow import ArrowScan  # lazy: see open_table

    for task in scan.plan_files():
        arrow = ArrowScan(
            scan.table_metadata, scan.io, scan.projection(), scan.row_filter, scan.case_sensitive
        )
        yield from arrow.to_record_batches([task])


def _schema_at(table, snapshot: int):
    """The schema the snapshot was written with (a later schema change does not move a version)."""
    snap = table.snapshot_by_id(snapshot)
    schemas = table.schemas()
    return (
        schemas.get(snap.schema_id, table.schema())
        if snap.schema_id is not None
        else table.schema()
    )


def check_iceberg(spec: SourceSpec, sample_bytes: int) -> dict[str, int]:
    """The table opens, its columns are found, the filter binds: the first block is read."""
    first = next(iter_iceberg(spec, block_bytes=max(PARQUET_ROW_BYTES, sample_bytes)), None)
    return {spec.uri: 0 if first is None else first.column("malformed").null_count}


def _first_line(err: Exception) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return " ".join(lines[:2])[:400] if lines else type(err).__name__
