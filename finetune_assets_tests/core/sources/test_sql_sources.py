"""SQL sources read the same rows every time: whatever the physical row order, whatever the
types of a block's neighbours, with colons in literals, against SQLite and the real PostgreSQL
server CI starts (``.ci/test_postgres.sh``). Black-box through ``versions add`` + ``raw_reviews``.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest

from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets.core.sources.tables.sql import iter_sql
from finetune_assets_tests.conftest import _real_rows
from finetune_assets_tests.core.sources.test_table_sources import _add, _raw, home  # noqa: F401


@pytest.fixture(scope="module")
def reviews(arabic_reviews: Path) -> list[tuple[str, str]]:
    return _real_rows(arabic_reviews / "PROD.csv")[:60]


def test_colon_in_a_literal_is_not_a_bind_parameter(capsys, home, tmp_path, reviews, monkeypatch):  # noqa: F811
    db = tmp_path / "r.db"
    rows = [(f"{t} :love it" if i % 2 else t, lab) for i, (t, lab) in enumerate(reviews)]
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE r (body TEXT, sentiment TEXT)")
        conn.executemany("INSERT INTO r VALUES (?, ?)", rows)
    monkeypatch.setenv("R_DB", f"sqlite:///{db}")
    code, out, err = _add(
        capsys,
        home,
        "c",
        "--source",
        "sql:R_DB",
        "--query",
        "SELECT body, sentiment FROM r WHERE body LIKE '% :love%'",
    )
    assert code == 0, err
    assert f"rows={len(reviews) // 2}" in out


def test_a_mixed_type_column_reads_the_same_in_any_block_size(tmp_path, monkeypatch):
    """An all-integer block of the text column is the same text as in a block mixing types."""
    db = tmp_path / "m.db"
    rows = [(i, "Positive") for i in range(1000, 1300)] + [(f"review {i}", 1) for i in range(300)]
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE m (text, label)")  # no declared types: SQLite keeps each one's
        conn.executemany("INSERT INTO m VALUES (?, ?)", rows)
    monkeypatch.setenv("M_DB", f"sqlite:///{db}")
    spec = SourceSpec(uri="sql:M_DB", query="m")
    small = pa.concat_tables(iter_sql(spec, block_bytes=50 * 1024))
    large = pa.concat_tables(iter_sql(spec))
    assert small.equals(large)
    assert small.column("malformed").null_count == len(rows)
    assert "1000" in small.column("text").to_pylist() and "1" in small.column("label").to_pylist()


@pytest.fixture
def postgres_db(postgres_url, monkeypatch):
    """A fresh database on the test PostgreSQL server (conftest), its URL also in $REVIEWS_PG."""
    # SQLAlchemy 2.1's default PostgreSQL driver is psycopg 3; the project ships psycopg2
    monkeypatch.setenv(
        "REVIEWS_PG", postgres_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    )
    return postgres_url


def test_postgres_version_survives_a_physical_reorder(
    capsys,
    home,
    storage_root,
    postgres_db,
    reviews,  # noqa: F811
):
    """CLUSTER rewrites the table in another physical order: re-materializing the version gives
    the same published rows, row numbers and splits (the read is ORDER BY text and label).
    """
    import psycopg2

    with psycopg2.connect(postgres_db) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE reviews (id serial PRIMARY KEY, shuffle int, body text, label text)"
        )
        cur.executemany(
            "INSERT INTO reviews (shuffle, body, label) VALUES (%s, %s, %s)",
            [((i * 37) % 61, t, lab) for i, (t, lab) in enumerate(reviews)],
        )
        cur.execute("CREATE INDEX by_shuffle ON reviews (shuffle)")
    code, out, err = _add(
        capsys,
        home,
        "pg",
        "--source",
        "sql:REVIEWS_PG",
        "--query",
        "reviews",
        "--where",
        "label <> 'Mixed' OR id::text LIKE '%:%'",
        labels="Positive,Negative",
    )
    assert code == 0, err
    record = (Path(home["store"].url("versions", "pg.json"))).read_text()
    assert ";db=" in record  # the snapshot marker, taken in the read's own transaction
    meta, first = _raw(storage_root, "pg")
    with psycopg2.connect(postgres_db) as conn, conn.cursor() as cur:
        cur.execute("CLUSTER reviews USING by_shuffle")
        cur.execute("SELECT body FROM reviews LIMIT 3")
        moved = [r[0] for r in cur.fetchall()]
    assert moved != [t for t, _ in reviews[:3]]  # the physical order did change
    again_meta, again = _raw(storage_root, "pg")
    assert again.equals(first)
    assert meta["rows_in"] == again_meta["rows_in"] == sum(lab != "Mixed" for _, lab in reviews)


def test_postgres_read_is_one_read_only_snapshot(postgres_db, reviews):
    """The read's transaction is REPEATABLE READ and read-only: a write inside it is refused."""
    import sqlalchemy as sa

    from finetune_assets.core.sources.tables import sql

    engine = sa.create_engine(os.environ["REVIEWS_PG"])
    with engine.connect().execution_options(**sql.SNAPSHOT_OPTIONS["postgresql"]) as conn:
        with conn.begin():
            level = conn.execute(sa.text("SHOW transaction_isolation")).scalar()
            readonly = conn.execute(sa.text("SHOW transaction_read_only")).scalar()
    engine.dispose()
    assert (level, readonly) == ("repeatable read", "on")
    with psycopg2_table(postgres_db, reviews):
        spec = SourceSpec(uri="sql:REVIEWS_PG", query="r")
        assert read_source(spec).num_rows == len(reviews)


class psycopg2_table:  # noqa: N801 - a context manager used as a statement
    def __init__(self, url, rows):
        self.url, self.rows = url, rows

    def __enter__(self):
        import psycopg2

        with psycopg2.connect(self.url) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE r (text text, label text)")
            cur.executemany("INSERT INTO r VALUES (%s, %s)", self.rows)

    def __exit__(self, *exc):
        return False
