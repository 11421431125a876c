"""``sql:ENV_NAME`` sources: a table or query of any database SQLAlchemy reaches, streamed in
batches.

The connection URL is read from the environment variable ``ENV_NAME`` when rows are read (in a pod:
a Kubernetes Secret mounted as that variable): only the variable's name is in the source, so the URL
and its password never reach a version file, run metadata or a log line (error messages are scrubbed
of it). ``SourceSpec.query`` is a table name or a SELECT; ``SourceSpec.where`` an optional SQL
predicate.

A database table has no version to travel back to, so registration records what was read: a content
hash of the rows (independent of their order) and their count (``SourceSpec.snapshot``), plus the
database's snapshot marker where it has one (PostgreSQL). Every read recomputes the hash while
streaming and refuses the version at the end if the rows changed, before anything is published.

So that a version's rows come in one order whatever the database's physical order (a ``VACUUM
FULL`` or ``CLUSTER`` moves them), every read is ``ORDER BY`` the text and label columns, and a
value's type never depends on its neighbours (a block of integers in a text column reads as the
same text as a block mixing them): each value is read as text by itself. The read, and the
snapshot marker, run in one read-only REPEATABLE READ transaction where the dialect has one.
Colons in the query are escaped (``' :word'`` in a literal is not a bind parameter), and
``where`` is parsed and re-rendered for the database's dialect (:mod:`.predicate`), never spliced.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal

import pyarrow as pa

from finetune_assets.core.sources.base import (
    BLOCK_BYTES,
    PARQUET_ROW_BYTES,
    SourceError,
    SourceSpec,
)
from finetune_assets.core.sources.columns import raw_block, source_columns
from finetune_assets.core.sources.tables.predicate import render_where

SQL_PREFIX = "sql:"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TABLE_NAME = re.compile(r"[A-Za-z_][\w$]*(\.[A-Za-z_][\w$]*)?")
# Read where the database offers one: which snapshot the rows came from (informational: it cannot be
# re-read).
SNAPSHOT_MARKERS = {"postgresql": "SELECT pg_current_snapshot()::text"}
# One consistent, read-only snapshot for the read (SQLAlchemy execution options per dialect).
SNAPSHOT_OPTIONS = {
    "postgresql": {"isolation_level": "REPEATABLE READ", "postgresql_readonly": True},
    "mysql": {"isolation_level": "REPEATABLE READ", "mysql_readonly": True},
}
# SQLAlchemy dialect -> sqlglot dialect, for rendering --where.
SQLGLOT_DIALECTS = {
    "postgresql": "postgres",
    "sqlite": "sqlite",
    "mysql": "mysql",
    "mariadb": "mysql",
    "oracle": "oracle",
    "mssql": "tsql",
    "duckdb": "duckdb",
    "snowflake": "snowflake",
    "bigquery": "bigquery",
}


def _env_name(spec: SourceSpec) -> str:
    name = spec.uri[len(SQL_PREFIX) :]
    if not ENV_NAME.fullmatch(name):
        raise SourceError(
            f"{spec.uri}: expected sql:ENV_NAME, the name of an environment variable holding the "
            "database URL (the URL itself is never written into a source)"
        )
    if not spec.query:
        raise SourceError(f"{spec.uri}: no table or query (CLI --query TABLE_OR_SELECT)")
    return name


def _url(spec: SourceSpec) -> str:
    name = _env_name(spec)
    url = os.environ.get(name)
    if not url:
        raise SourceError(
            f"{spec.uri}: environment variable {name} is not set (it holds the database URL; "
            "in Kubernetes, from a Secret: deploy/README.md)"
        )
    return url


def _scrub(text: str, url: str) -> str:
    """An error message without the URL or its password (drivers quote either)."""
    # lazy, as every sqlalchemy import here: the code location imports every source family; a
    # family's library loads when it is read
    from sqlalchemy.engine import make_url

    secrets = [url]
    try:
        parsed = make_url(url)
        secrets += [str(parsed.password)] if parsed.password else []
    except Exception:  # an unparsable URL: the whole string is scrubbed
        pass
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _base(spec: SourceSpec, quote) -> str:
    """The user's table or SELECT as the body of a subquery, colons escaped for ``sa.text``."""
    query = spec.query.strip().rstrip(";")
    if TABLE_NAME.fullmatch(query):
        query = "SELECT * FROM " + ".".join(quote(p) for p in query.split("."))
    return query.replace(":", "\\:")


def _statement(spec: SourceSpec, dialect, order: list[str] | None) -> str:
    """The ordered, filtered read (``order`` None: a probe for the column names, no rows)."""
    quote = dialect.identifier_preparer.quote
    sql = f"SELECT * FROM ({_base(spec, quote)}) src"
    where = None
    if spec.where:
        where, _ = render_where(spec.where, None, SQLGLOT_DIALECTS.get(dialect.name))
        where = where.replace(":", "\\:")
    if order is None:
        return sql + " WHERE 1 = 0"
    sql += f" WHERE {where}" if where else ""
    return sql + " ORDER BY " + ", ".join(quote(c) for c in order)


def _engine(spec: SourceSpec, url: str):
    import sqlalchemy as sa  # lazy: see _scrub
    from sqlalchemy.pool import NullPool

    env = _env_name(spec)
    try:
        parsed = sa.engine.make_url(url)
    except Exception:  # the message would quote the URL
        raise SourceError(
            f"{spec.uri}: ${env} is not a database URL (dialect+driver://user:password@host/db)"
        ) from None
    database = parsed.database
    if (
        parsed.get_backend_name() == "sqlite"
        and database not in (None, "", ":memory:")
        and not database.startswith("file:")
        and not os.path.exists(database)
    ):
        raise SourceError(
            f"{spec.uri}: the SQLite database named by ${env} does not exist (nothing is created)"
        )
    try:
        return sa.create_engine(parsed, poolclass=NullPool)
    except Exception as err:  # a missing driver, an unknown dialect
        raise SourceError(
            f"{spec.uri}: cannot use the database URL in ${env}: {_scrub(_line(err), url)}"
        ) from None


def _content(rows: int, total: int) -> str:
    return f"rows={rows};content={total:064x}"


def iter_sql(
    spec: SourceSpec, block_bytes: int = BLOCK_BYTES, limit: int | None = None
) -> Iterator[pa.Table]:
    """The query's rows as :data:`RAW_SCHEMA` blocks; the content is checked against
    ``spec.snapshot``.
    """
    for block, _ in _read(spec, block_bytes, limit):
        yield block


def _read(
    spec: SourceSpec, block_bytes: int, limit: int | None = None
) -> Iterator[tuple[pa.Table, str]]:
    """(block, content so far) pairs; after the last block the content is compared with the recorded
    one.
    """
    import sqlalchemy as sa  # lazy: see _scrub

    url = _url(spec)
    engine = _engine(spec, url)
    rows_per_block = max(1, block_bytes // PARQUET_ROW_BYTES)
    total, row = 0, 0
    dialect = engine.dialect
    try:
        with (
            engine.connect().execution_options(**SNAPSHOT_OPTIONS.get(dialect.name, {})) as conn,
            conn.begin(),
        ):
            marker = _marker(conn, dialect.name)
            names = list(conn.execute(sa.text(_statement(spec, dialect, None))).keys())
            order = source_columns(pa.table({n: pa.nulls(0) for n in names}).schema, spec)
            result = conn.execution_options(stream_results=True, yield_per=rows_per_block).execute(
                sa.text(_statement(spec, dialect, order))
            )
            for part in result.partitions(rows_per_block):
                raw = raw_block(_table(names, part, spec.uri), spec, row)
                total = (total + _rows_hash(raw)) % (1 << 256)
                row += raw.num_rows
                yield raw, _content(row, total) + marker
                if limit is not None and row >= limit:
                    return
    except SourceError:
        raise
    except Exception as err:  # connection, permissions, table, column, SQL
        raise SourceError(
            f"{spec.uri}: cannot read {spec.query!r}: {_scrub(_line(err), url)}"
        ) from None
    finally:
        engine.dispose()
    _check_unchanged(spec, _content(row, total))


def _table(names: list[str], rows: list, uri: str) -> pa.Table:
    """The rows as text columns, each value by itself (never by the types of its block)."""
    columns = list(zip(*rows)) if rows else [() for _ in names]
    return pa.table(
        {
            name: pa.array([_text(v) for v in values], pa.string())
            for name, values in zip(names, columns)
        }
    )


def _text(value) -> str | None:
    """A database value as text: integral numbers without ``.0`` (as labels are compared)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value != value:  # NaN: no value
        return None
    if isinstance(value, (float, Decimal)) and value == int(value):
        return str(int(value))
    return str(value)


def _rows_hash(raw: pa.Table) -> int:
    """Sum of the rows' hashes: the same multiset of (text, label) rows gives the same sum in any
    order.
    """
    total = 0
    for text, label in zip(raw.column("text").to_pylist(), raw.column("label").to_pylist()):
        digest = hashlib.sha256(f"{text!r}\x1f{label!r}".encode()).digest()
        total += int.from_bytes(digest, "big")
    return total


def _check_unchanged(spec: SourceSpec, now: str) -> None:
    recorded = (spec.snapshot or "").split(";db=")[0]
    if recorded and recorded != now:
        raise SourceError(
            f"{spec.uri}: the rows of {spec.query!r} changed since the version was registered "
            f"({recorded} -> {now}); a dataset version is immutable: register the rows as they "
            "are now under a new key"
        )


def pin_sql(spec: SourceSpec) -> SourceSpec:
    """Read everything once (streamed) and record its content hash, and the database snapshot
    marker taken in the same transaction.
    """
    content = _content(0, 0)
    for _, content in _read(replace(spec, snapshot=None), BLOCK_BYTES):  # noqa: B007 - the last one
        pass
    return replace(spec, snapshot=content)


def _marker(conn, dialect: str) -> str:
    """The snapshot the read's transaction sees, where the database names one."""
    import sqlalchemy as sa  # lazy: see _scrub

    sql = SNAPSHOT_MARKERS.get(dialect)
    return (
        ""
        if sql is None
        else f";db={conn.execute(sa.text(sql.replace(':', chr(92) + ':'))).scalar()}"
    )


def check_sql(spec: SourceSpec, sample_bytes: int) -> dict[str, int]:
    """The variable is set, the database answers, the table or query and its columns are found."""
    block = next(iter_sql(replace(spec, snapshot=None), sample_bytes, limit=1), None)
    return {spec.uri: 0 if block is None else block.column("malformed").null_count}


def describe_sql(spec: SourceSpec) -> dict:
    """What is read (never the URL: only the name of the variable that holds it)."""
    return {
        "sql_url_env": _env_name(spec),
        "sql_query": spec.query,
        "sql_where": spec.where,
        "sql_snapshot": spec.snapshot,
    }


def _line(err: Exception) -> str:
    err = getattr(err, "orig", None) or err
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0][:400] if lines else type(err).__name__
