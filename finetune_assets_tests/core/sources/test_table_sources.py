"""Delta tables and SQL databases as sources: registered through the CLI, materialized through
Dagster.

Real reviews (the shared Arabic PROD.csv) plus a few hostile rows, written with ``deltalake`` and
into a real SQLite file, go through the same intake as files: exact accounting, quarantine,
duplicates.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from finetune_assets.core.io.contracts import REVIEWS_FILE
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets_tests.cli.test_cli import run_cli
from finetune_assets_tests.conftest import _real_rows
from finetune_assets_tests.defs.data.test_data_assets import materialize

# Rows the intake must reject, one reason each (validate.py): a blank text, an unknown label, a
# repeat.
HOSTILE = [("   ", "Positive"), ("a review with a label nobody knows", "Stellar")]


@pytest.fixture(scope="module")
def reviews(arabic_reviews: Path) -> list[tuple[str, str]]:
    return _real_rows(arabic_reviews / "PROD.csv")[:90]


def _table(rows: list[tuple[str, str]]) -> pa.Table:
    return pa.table(
        {
            "review_text": [t for t, _ in rows],
            "polarity": [lab for _, lab in rows],
            "stars": list(range(len(rows))),
        }
    )


@pytest.fixture
def home(tmp_path: Path, storage_root: Path, monkeypatch) -> dict:
    """The CLI's Dagster home and storage root (as a user's shell would have them)."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    return {"root": ("--root", str(storage_root)), "store": Storage(str(storage_root))}


def _add(
    capsys, home: dict, key: str, *args: str, labels: str = "Positive,Negative,Mixed"
) -> tuple[int, str, str]:
    """``versions add`` with the seed's classes, so that an unknown label is quarantined, not a
    class.
    """
    return run_cli(capsys, *home["root"], "versions", "add", key, *args, "--labels", labels)


def _raw(storage_root: Path, key: str) -> tuple[dict, pa.Table]:
    """(metadata of the materialization, the accepted reviews) of raw_reviews[key]."""
    result = materialize(storage_root, dg.DagsterInstance.get(), ["raw_reviews"], key)
    [event] = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    published = Storage(str(storage_root)).current("raw_reviews", key)
    table = pq.read_table(f"{published.url}/{REVIEWS_FILE}")
    assert meta["rows_in"] == meta["dagster/row_count"] + meta["rejected_rows"]
    return meta, table


def test_delta_version_is_pinned_and_time_travels(capsys, home, storage_root, tmp_path, reviews):
    """Registered at version 1, re-materialized identically after an append and a delete; a key at
    the latest version sees both.
    """
    from deltalake import DeltaTable, write_deltalake

    path = tmp_path / "reviews_delta"
    write_deltalake(path, _table(reviews[:30] + HOSTILE))  # version 0
    # 1: a repeat of row 0
    write_deltalake(path, _table(reviews[30:60] + reviews[:1]), mode="append")
    code, out, err = _add(
        capsys, home, "k1", "--source", f"delta:{path}", "--text-column", "review_text"
    )
    assert code == 0, err
    assert f"delta:{path}@version=1" in out
    record = json.loads(Path(home["store"].url("versions", "k1.json")).read_text())
    assert record["source"]["uri"] == f"delta:{path}@version=1"

    meta, first = _raw(storage_root, "k1")
    assert meta["rows_in"] == 63 and meta["dagster/row_count"] == 60
    assert meta["rejected_by_reason"] == {"empty_text": 1, "unknown_label": 1, "duplicate": 1}
    assert (meta["delta_version"], meta["delta_latest_version"]) == (1, 1)

    write_deltalake(path, _table(reviews[60:90]), mode="append")  # version 2
    deleted = [t for t, _ in reviews[:5]]
    DeltaTable(path).delete(" OR ".join(f"review_text = '{t}'" for t in deleted))  # version 3
    again_meta, again = _raw(storage_root, "k1")
    assert again.equals(first)  # the same rows, in the same order, with the same splits
    assert (again_meta["delta_version"], again_meta["delta_latest_version"]) == (1, 3)

    code, out, err = _add(
        capsys, home, "k2", "--source", f"delta:{path}", "--text-column", "review_text"
    )
    assert code == 0 and "@version=3" in out, err
    latest_meta, latest = _raw(storage_root, "k2")
    texts = set(latest.column("text").to_pylist())
    assert not texts & set(deleted) and {t for t, _ in reviews[60:90]} <= texts
    assert latest_meta["dagster/row_count"] == 85


def test_delta_filter_and_columns_are_part_of_the_version(capsys, home, tmp_path, reviews):
    from deltalake import write_deltalake

    path = tmp_path / "t"
    write_deltalake(path, _table(reviews[:40]))
    code, out, err = _add(
        capsys,
        home,
        "pos",
        "--source",
        f"delta:{path}@version=0",
        "--where",
        "polarity <> 'Mixed'",
        "--text-column",
        "review_text",
        labels="Positive,Negative",
    )
    assert code == 0, err
    record = json.loads(Path(home["store"].url("versions", "pos.json")).read_text())
    spec = SourceSpec(**record["source"])
    assert spec.where == "polarity <> 'Mixed'"
    read = read_source(spec)
    assert set(read.column("label").to_pylist()) == {"Positive", "Negative"}
    assert read.num_rows == sum(lab != "Mixed" for _, lab in reviews[:40])
    # another filter under the same key is another dataset: refused
    code, _, err = _add(
        capsys,
        home,
        "pos",
        "--source",
        f"delta:{path}@version=0",
        "--where",
        "polarity <> 'Mixed' AND stars > 0",
        "--text-column",
        "review_text",
        labels="Positive,Negative",
    )
    assert code != 0 and "other options" in err


@pytest.mark.parametrize(
    "case", ["missing table", "bad version", "wrong column", "bad filter", "vacuumed", "bad url"]
)
def test_delta_problems_are_one_line_and_register_nothing(capsys, home, tmp_path, reviews, case):
    from deltalake import DeltaTable, write_deltalake

    path = tmp_path / "t"
    write_deltalake(path, _table(reviews[:10]))
    write_deltalake(path, _table(reviews[10:20]), mode="overwrite")
    args, expect = {
        "missing table": ([f"delta:{tmp_path / 'nope'}"], "no Delta table"),
        "bad version": ([f"delta:{path}@version=7"], "its latest version is 1"),
        "wrong column": ([f"delta:{path}", "--text-column", "body"], "no text column 'body'"),
        "bad filter": ([f"delta:{path}", "--where", "no_such = 1"], "row filter (--where)"),
        "vacuumed": ([f"delta:{path}@version=0"], "vacuumed"),
        "bad url": (["delta:nosuchscheme://bucket/t"], "no Delta table at nosuchscheme://bucket/t"),
    }[case]
    if case == "vacuumed":
        DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    code, out, err = (
        _add(capsys, home, "k", "--source", *args, "--text-column", "review_text")
        if case != "wrong column"
        else _add(capsys, home, "k", "--source", *args)
    )
    assert code != 0 and expect in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not Path(home["store"].url("versions", "k.json")).exists()


def _partitioned_table(path: Path, reviews: list[tuple[str, str]]) -> None:
    """Partitioned by language, a date column added by a later commit, some rows deleted."""
    import datetime as dt

    from deltalake import DeltaTable, write_deltalake

    first = _table(reviews[:40]).append_column("lang", pa.array(["ar", "en"] * 20))
    write_deltalake(path, first, partition_by=["lang"])
    later = _table(reviews[40:80]).append_column("lang", pa.array(["ar"] * 30 + ["fr"] * 10))
    days = [dt.date(2024, 1, 1 + i % 5) for i in range(40)]
    later = later.append_column("day", pa.array(days, pa.date32()))
    write_deltalake(path, later, mode="append", schema_mode="merge", partition_by=["lang"])
    DeltaTable(path).delete("stars = 3")


def _datafusion_rows(path: Path, version: int, where: str | None) -> list[tuple]:
    """What delta-rs' DataFusion engine itself keeps for the user's text: the oracle."""
    from deltalake import DeltaTable, QueryBuilder

    qb = QueryBuilder({"datafusion.execution.target_partitions": "1"}).register(
        "src", DeltaTable(path, version=version)
    )
    sql = "SELECT review_text, polarity FROM src" + (f" WHERE {where}" if where else "")
    return [tuple(r.values()) for r in pa.table(qb.execute(sql).read_all()).to_pylist()]


@pytest.mark.parametrize(
    "where",
    [
        None,
        "lang = 'ar'",
        "day >= '2024-01-03' OR lang <> 'ar'",
        "stars NOT IN (1, 2) AND polarity IN ('Positive', 'Mixed')",
        "NOT (stars IN (1, 2)) OR day IS NULL",
        "day IS NULL AND NOT (stars BETWEEN 5 AND 30)",
        "review_text LIKE '%ا%' AND \"lang\" != 'fr'",
        "length(review_text) > 60",
    ],
)
def test_delta_reader_reads_what_datafusion_reads(tmp_path, reviews, monkeypatch, where):
    """Partition values, a column older files lack, deletes and SQL's NULL rules: the rows
    DataFusion keeps for the user's predicate, in the snapshot's order; a table without a filter
    is streamed through delta-rs' pyarrow dataset, without running DataFusion.
    """
    import deltalake

    path = tmp_path / "t"
    _partitioned_table(path, reviews)
    spec = SourceSpec(uri=f"delta:{path}@version=2", text_column="review_text", where=where)
    expected = _datafusion_rows(path, 2, where)
    if where is None:
        monkeypatch.setattr(deltalake, "QueryBuilder", None)  # DataFusion is not what reads it
    got = read_source(spec).select(["text", "label"]).to_pylist()
    assert got and [tuple(r.values()) for r in got] == expected


def test_delta_row_group_is_read_through_a_small_buffer(tmp_path, monkeypatch):
    """One ~10 MB row group (delta-rs and Spark write ~128 MB ones) is read a buffer at a time
    through delta-rs' own storage, never as a whole column chunk: what keeps a Delta source's
    memory as bounded as a file's.
    """
    import os

    from deltalake import write_deltalake
    from deltalake.fs import DeltaStorageHandler

    from finetune_assets.core.sources.tables import delta

    n = 20_000  # random hex: snappy cannot shrink the 10 MB text column chunk
    texts = [os.urandom(250).hex() for _ in range(n)]
    write_deltalake(tmp_path / "t", pa.table({"text": texts, "label": ["Positive"] * n}))
    largest, real_open = [], DeltaStorageHandler.open_input_file

    class Spy:
        """A file object that records the largest read the Parquet reader asks of it."""

        def __init__(self, f):
            self.f = f

        def read(self, size=-1):
            data = self.f.read(size)
            largest.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

    def spying_open(self, path):
        return pa.PythonFile(Spy(real_open(self, path)), mode="r")

    monkeypatch.setattr(DeltaStorageHandler, "open_input_file", spying_open)
    blocks = list(delta.iter_delta(SourceSpec(uri=f"delta:{tmp_path / 't'}"), 100 * 1024))
    assert sum(b.num_rows for b in blocks) == n and max(b.num_rows for b in blocks) <= 100
    assert largest and max(largest) < 4 << 20  # the column chunk is 10 MB


# -- SQL ------------------------------------------------------------------------------------------

SECRET = (
    "s3cr3t-t0ken-7f1c"  # stands in for a password: it is in the URL's path, so SQLite accepts it
)


@pytest.fixture
def sqlite_db(tmp_path, reviews, monkeypatch) -> Path:
    """A real SQLite file whose URL (in $REVIEWS_DB_URL) holds a secret that must never be
    written.
    """
    import sqlite3

    folder = tmp_path / SECRET
    folder.mkdir()
    db = folder / "reviews.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE reviews (id INTEGER PRIMARY KEY, body TEXT, sentiment TEXT)")
        conn.executemany(
            "INSERT INTO reviews (body, sentiment) VALUES (?, ?)",
            reviews[:50] + HOSTILE + [reviews[3], (None, "Negative")],
        )
    monkeypatch.setenv("REVIEWS_DB_URL", f"sqlite:///{db}")
    return db


def test_sql_query_through_the_data_graph_without_leaking_the_url(
    capsys, home, storage_root, sqlite_db, reviews
):
    import sqlite3

    code, out, err = _add(
        capsys,
        home,
        "s1",
        "--source",
        "sql:REVIEWS_DB_URL",
        "--query",
        "SELECT body, sentiment FROM reviews ORDER BY id",
    )
    assert code == 0, err
    assert "rows=54" in out
    meta, table = _raw(storage_root, "s1")
    assert meta["rows_in"] == 54 and meta["dagster/row_count"] == 50
    assert meta["rejected_by_reason"] == {"empty_text": 2, "unknown_label": 1, "duplicate": 1}
    assert meta["sql_url_env"] == "REVIEWS_DB_URL"

    # the credential is nowhere: stdout/stderr, version file, metadata, run logs, any file written
    instance = dg.DagsterInstance.get()
    logs = " ".join(
        str(e.message) + json.dumps(str(e.dagster_event))
        for run in instance.get_runs()
        for e in instance.all_logs(run.run_id)
    )
    assert SECRET not in out + err + repr(meta) + logs  # repr: TableSchema refuses json's iteration
    for root in (storage_root, Path(instance.root_directory)):
        for f in root.rglob("*"):
            assert not f.is_file() or SECRET.encode() not in f.read_bytes(), f

    # a table name and a row filter read the same way
    negatives = read_source(
        SourceSpec(uri="sql:REVIEWS_DB_URL", query="reviews", where="sentiment = 'Negative'")
    )
    assert set(negatives.column("label").to_pylist()) == {"Negative"}
    assert (
        negatives.num_rows == sum(lab == "Negative" for _, lab in reviews[:50] + [reviews[3]]) + 1
    )

    # the rows changed: the version is refused at the end of the read, nothing published
    before = Storage(str(storage_root)).current("raw_reviews", "s1").attempt
    with sqlite3.connect(sqlite_db) as conn:
        conn.execute("INSERT INTO reviews (body, sentiment) VALUES ('late arrival', 'Positive')")
    result = materialize(storage_root, instance, ["raw_reviews"], "s1", raise_on_error=False)
    assert not result.success
    assert Storage(str(storage_root)).current("raw_reviews", "s1").attempt == before


@pytest.mark.parametrize(
    "case", ["no variable", "missing table", "wrong column", "missing database", "not a url"]
)
def test_sql_problems_are_one_line_without_the_url(capsys, home, sqlite_db, monkeypatch, case):
    args = ["--source", "sql:REVIEWS_DB_URL", "--query", "reviews"]
    expect = {
        "no variable": "REVIEWS_DB_URL is not set",
        "missing table": "no such table",
        "wrong column": "no text column 'nope'",
        "missing database": "does not exist",
        "not a url": "not a database URL",
    }[case]
    if case == "no variable":
        monkeypatch.delenv("REVIEWS_DB_URL")
    elif case == "missing table":
        args[-1] = "old_reviews"
    elif case == "wrong column":
        args += ["--text-column", "nope"]
    elif case == "missing database":
        monkeypatch.setenv("REVIEWS_DB_URL", f"sqlite:///{sqlite_db.parent}/gone.db")
    else:
        monkeypatch.setenv("REVIEWS_DB_URL", f"{SECRET}@@not a url")
    code, out, err = _add(capsys, home, "s", *args)
    assert code != 0 and expect in err, err
    assert len(err.strip().splitlines()) == 1 and SECRET not in err
    assert not Path(home["store"].url("versions", "s.json")).exists()
    assert not (sqlite_db.parent / "gone.db").exists()


def test_every_family_gets_the_same_intake(tmp_path, reviews, monkeypatch):
    """The same rows as a CSV file, a Delta table and a SQLite table: the same accepted reviews with
    the same hash splits, and the same rejections for the same reasons.
    """
    import csv
    import sqlite3

    from deltalake import write_deltalake

    from finetune_assets.core.prep.validate import ValidationRules, validate

    rows = reviews[:40] + HOSTILE + [reviews[7]]
    with (tmp_path / "r.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("review_text", "polarity"), *rows])
    write_deltalake(tmp_path / "delta", _table(rows))
    with sqlite3.connect(tmp_path / "r.db") as conn:
        conn.execute("CREATE TABLE r (review_text TEXT, polarity TEXT)")
        conn.executemany("INSERT INTO r VALUES (?, ?)", rows)
    monkeypatch.setenv("R_DB", f"sqlite:///{tmp_path / 'r.db'}")
    specs = [
        SourceSpec(uri=str(tmp_path / "r.csv")),
        SourceSpec(uri=f"delta:{tmp_path / 'delta'}"),
        SourceSpec(uri="sql:R_DB", query="SELECT * FROM r ORDER BY rowid"),
    ]
    seen = []
    for spec in specs:
        result = validate(read_source(spec), ValidationRules())
        accepted = sorted(
            zip(*(result.accepted.column(c).to_pylist() for c in ("text", "label", "split")))
        )
        seen.append((accepted, sorted(result.rejected.column("reason").to_pylist())))
    assert seen[0][1] == ["duplicate", "empty_text", "unknown_label"]
    assert seen[0] == seen[1] == seen[2]
