"""``delta:PATH_OR_URL[@version=N|@timestamp=ISO]`` sources: a Delta Lake table through
``deltalake``.

Registration pins the exact table version (:func:`pin_delta` rewrites the URI to ``@version=N``), so
a dataset version reads the same rows forever (time travel), whatever was committed since. Only
the text and label columns (and those ``SourceSpec.where`` names) are read. The version is read
by delta-rs itself, never by our own reading of its log: a plain table through delta-rs' pyarrow
dataset (its fragments, partition values and schema, its storage with the table's storage options),
streamed in record batches of about ``block_bytes`` through a small read buffer, so memory stays
bounded whatever the writer's row-group size; a table with column mapping (``name`` or ``id``, the
old reader-2 / writer-5 protocol as well as the ``columnMapping`` reader feature), deletion vectors,
or a ``where`` (parsed and type-checked by :mod:`.predicate`, then evaluated by DataFusion) through
delta-rs' DataFusion engine. A reader feature delta-rs cannot honour is refused by name.
Storage options (``SourceSpec.storage_options``; a value ``env:NAME`` is read from the environment
when the table is opened, so secrets stay out of the version record) go to delta-rs for every
``s3://``, ``abfss://``, ``gs://`` table; delta-rs also reads its usual ``AWS_*`` / ``AZURE_*`` /
``GOOGLE_*`` variables itself.
"""

from __future__ import annotations

import os
import re
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
from finetune_assets.core.sources.tables.predicate import render_where

DELTA_PREFIX = "delta:"
# One DataFusion partition: files are scanned one after another in the snapshot's order, so one
# table version gives its rows in one order every time (several partitions interleave them by
# timing).
SESSION = {"datafusion.execution.target_partitions": "1"}
# Bytes of a column chunk the streamed reader holds at once (pyarrow's buffered stream).
READ_BUFFER = 1 << 20
# Reader features delta-rs' DataFusion scan honours (delta-kernel's ReaderFeature list); a table
# needing any other is refused with the feature named rather than read without it.
HONOURED_READER_FEATURES = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "variantType",
        "variantType-preview",
    }
)
# Features whose rows only DataFusion's scan reads right (pyarrow datasets read physical names and
# ignore deletion vectors).
ENGINE_FEATURES = frozenset({"columnMapping", "deletionVectors"})


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


def storage_options(options: dict[str, str] | None) -> dict[str, str] | None:
    """The options for delta-rs, each ``env:NAME`` value read from the environment now."""
    if not options:
        return None
    out = {}
    for key, value in options.items():
        if isinstance(value, str) and value.startswith("env:"):
            name = value[len("env:") :]
            if name not in os.environ:
                raise SourceError(f"storage option {key}: ${name} is not set in this environment")
            value = os.environ[name]
        out[key] = value
    return out


def open_table(uri: str, options: dict[str, str] | None = None):
    """The ``DeltaTable`` at the URI's version (latest without one); a failure is one line."""
    # lazy, as every deltalake import here: the code location imports every source family; a
    # family's library loads when it is read
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    ref = parse_delta(uri)
    resolved = storage_options(options)
    try:
        table = DeltaTable(ref.table, version=ref.version, storage_options=resolved)
        if ref.timestamp is not None:
            table.load_as_version(ref.timestamp)
    except TableNotFoundError:
        raise SourceError(
            f"{uri}: no Delta table at {ref.table} (no _delta_log there; check the path or URL)"
        ) from None
    except Exception as err:  # plain errors: bad URLs, versions, credentials
        raise SourceError(
            f"{uri}: cannot open the Delta table{_latest_hint(ref, resolved)}: {_first_line(err)}"
        ) from None
    return table


def _latest_hint(ref: DeltaRef, options: dict[str, str] | None = None) -> str:
    """For a pinned version the table does not (or no longer) hold: which versions it has."""
    if ref.version is None and ref.timestamp is None:
        return ""
    from deltalake import DeltaTable  # lazy: see open_table

    try:
        return (
            " at the requested version (its latest version is "
            f"{DeltaTable(ref.table, storage_options=options).version()})"
        )
    except Exception:  # the table itself cannot be opened: the error says why
        return ""


def pin_delta(spec: SourceSpec) -> SourceSpec:
    """The spec at the exact table version that ``@timestamp`` or "latest" means now."""
    version = open_table(spec.uri, spec.storage_options).version()
    return replace(spec, uri=parse_delta(spec.uri).pinned(version))


def describe_delta(spec: SourceSpec) -> dict:
    """Which table version is read, and the latest one (time travel is said, not silent)."""
    ref = parse_delta(spec.uri)
    latest = open_table(DELTA_PREFIX + ref.table, spec.storage_options).version()
    return {"delta_table": ref.table, "delta_version": ref.version, "delta_latest_version": latest}


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def iter_delta(spec: SourceSpec, block_bytes: int = BLOCK_BYTES) -> Iterator[pa.Table]:
    """The pinned table version's rows as :data:`RAW_SCHEMA` tables of about ``block_bytes``
    each.
    """
    table = open_table(spec.uri, spec.storage_options)
    features = _reader_features(table, spec.uri)
    columns = source_columns(pa.schema(table.schema().to_arrow()), spec)
    rows = max(1, block_bytes // PARQUET_ROW_BYTES)
    where = None
    if spec.where:
        where, read = render_where(spec.where, pa.schema(table.schema().to_arrow()))
        columns = list(dict.fromkeys([*columns, *read]))
    try:
        if where is None and not features & ENGINE_FEATURES:
            batches = _streamed(table, spec, columns, rows)
        else:
            batches = _engine(table, columns, where, rows)
        row = 0
        for batch in batches:
            raw = raw_block(_plain_strings(pa.Table.from_batches([batch])), spec, row)
            yield raw
            row += raw.num_rows
    except SourceError:
        raise
    except Exception as err:  # a vacuumed file, a lost connection, a bad filter
        gone = _missing_files(table, spec)
        if gone:
            raise VersionGone(
                f"{spec.uri}: {len(gone)} data file(s) of this table version are gone (vacuumed), "
                f"e.g. {gone[0]}: the version cannot be read again: register a version the table "
                "still holds"
            ) from None
        raise SourceError(f"{spec.uri}: {_read_problem(spec, err)}") from None


def _reader_features(table, uri: str) -> set[str]:
    """The reader features the version needs (column mapping on the old reader-2 protocol
    counted as ``columnMapping``); any delta-rs cannot honour is refused by name.
    """
    protocol = table.protocol()
    if protocol.min_reader_version > 3:
        raise SourceError(
            f"{uri}: the table needs Delta reader version {protocol.min_reader_version}; "
            "delta-rs reads up to 3"
        )
    features = set(protocol.reader_features or ())
    unknown = sorted(features - HONOURED_READER_FEATURES)
    if unknown:
        raise SourceError(
            f"{uri}: the table needs reader feature(s) {', '.join(unknown)}, which delta-rs "
            "cannot honour: its rows would be read wrong (nothing read)"
        )
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode != "none" or protocol.min_reader_version == 2:
        features.add("columnMapping")
    return features


def _streamed(table, spec: SourceSpec, columns: list[str], rows: int):
    """delta-rs' pyarrow dataset of the version (its files, partition values, schema and
    storage), scanned ``rows`` rows at a time with a read buffer and no pre-buffering, so a read
    holds ``READ_BUFFER`` bytes of a column chunk, not the chunk: Spark and Databricks write
    ~128 MB row groups (delta-rs up to ~1M rows), which DataFusion's scan would fetch whole. One
    thread reads the fragments in the snapshot's order, so a version's rows keep one order.
    """
    import pyarrow.dataset as pds  # imported when a table is read: it costs ~30 MB

    dataset = table.to_pyarrow_dataset()
    scan = pds.ParquetFragmentScanOptions(
        use_buffered_stream=True, buffer_size=READ_BUFFER, pre_buffer=False
    )
    return dataset.to_batches(
        columns=columns, batch_size=rows, use_threads=False, fragment_scan_options=scan
    )


def _engine(table, columns: list[str], where: str | None, rows: int) -> Iterator[pa.RecordBatch]:
    """DataFusion's scan (column mapping, deletion vectors, a row filter): it holds a row group's
    column chunks, so the writer's row-group size bounds its memory. ``where`` is the predicate
    rendered from its checked parse tree (:func:`.predicate.render_where`), not the user's text.
    """
    from deltalake import QueryBuilder  # lazy: see open_table

    sql = f"SELECT {', '.join(map(_quoted, columns))} FROM src" + (
        f" WHERE {where}" if where else ""
    )
    qb = QueryBuilder({**SESSION, "datafusion.execution.batch_size": str(rows)}).register(
        "src", table
    )
    for batch in pa.RecordBatchReader.from_stream(qb.execute(sql)):
        for start in range(0, batch.num_rows, rows):  # DataFusion may hand a file's rows at once
            yield batch.slice(start, rows)


def _missing_files(table, spec: SourceSpec) -> list[str]:
    """The version's data files its storage reports as not found (by file type, whatever the
    store's error text): a vacuumed version.
    """
    # lazy: see open_table (pyarrow.fs with it: only a failed read asks what is gone)
    import pyarrow.fs as pa_fs
    from deltalake.fs import DeltaStorageHandler

    try:
        paths = table.get_add_actions(flatten=True).column("path").to_pylist()
        handler = DeltaStorageHandler(table.table_uri, storage_options(spec.storage_options))
        infos = handler.get_file_info([str(p) for p in paths])
    except Exception:  # the store itself is unreachable: the read error says why
        return []
    return [i.path for i in infos if i.type == pa_fs.FileType.NotFound]


def _plain_strings(table: pa.Table) -> pa.Table:
    """DataFusion hands strings as ``string_view``: as plain strings (and binaries), like every
    other reader.
    """
    views = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    if not any(f.type in views for f in table.schema):
        return table
    return table.cast(pa.schema([f.with_type(views.get(f.type, f.type)) for f in table.schema]))


def _read_problem(spec: SourceSpec, err: Exception) -> str:
    text = _first_line(err)
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
