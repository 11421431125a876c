"""Delta tables as the protocol defines them, read as delta-rs' own engine reads them: column
mapping on the old reader-2 / writer-5 protocol (with a decoy physical column), SQL's NULL rules
in ``--where``, predicates checked before any engine runs, reader features refused by name, and
a property test of ``--where`` against DataFusion itself.

Black-box through ``versions add`` + ``raw_reviews`` where the behaviour is a user's.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finetune_assets.core.sources import SourceError, SourceSpec, read_source
from finetune_assets_tests.conftest import _real_rows
from finetune_assets_tests.core.sources.delta_tables import column_mapped_table
from finetune_assets_tests.core.sources.test_table_sources import _add, _raw, home  # noqa: F401

LABELS = ["Positive", "Negative", "Mixed"]


@pytest.fixture(scope="module")
def reviews(arabic_reviews: Path) -> list[tuple[str, str]]:
    return _real_rows(arabic_reviews / "PROD.csv")[:90]


def _datafusion(path: Path, select: str, where: str | None = None) -> list[dict]:
    from deltalake import DeltaTable, QueryBuilder

    qb = QueryBuilder({"datafusion.execution.target_partitions": "1"}).register(
        "src", DeltaTable(path)
    )
    sql = f"SELECT {select} FROM src" + (f" WHERE {where}" if where else "")
    return pa.table(qb.execute(sql).read_all()).to_pylist()


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapped_reader2_table_reads_logical_columns(
    capsys,
    home,
    storage_root,
    tmp_path,
    reviews,
    mode,  # noqa: F811
):
    """Reader 2 / writer 5 column mapping, the physical column ``text`` holding titles: the
    version's reviews are the logical ``text`` column, labels and all, as DataFusion reads them.
    """
    path = tmp_path / "mapped"
    n = len(reviews)
    column_mapped_table(
        path,
        {
            "text": [t for t, _ in reviews],
            "title": [f"title {i}" for i in range(n)],
            "label": [lab for _, lab in reviews],
        },
        physical={"text": "col-7f3a", "title": "text", "label": "col-b21c"},
        mode=mode,
    )
    code, out, err = _add(capsys, home, "cm", "--source", f"delta:{path}")
    assert code == 0, err
    meta, table = _raw(storage_root, "cm")
    expected = _datafusion(path, "text, label")
    assert meta["rows_in"] == n
    kept = {r["text"]: r["label"] for r in expected}
    got = dict(zip(table.column("text").to_pylist(), table.column("label").to_pylist()))
    assert got and all(kept[t] == lab for t, lab in got.items())
    assert not any(t.startswith("title ") for t in got)
    assert len(got) + meta["rejected_rows"] == n


def _nulls_table(path: Path, reviews: list[tuple[str, str]]) -> None:
    """Stars 1-5 with every fifth one null, a polarity with some nulls."""
    from deltalake import write_deltalake

    n = len(reviews)
    write_deltalake(
        path,
        pa.table(
            {
                "review_text": [t for t, _ in reviews],
                "polarity": [lab for _, lab in reviews],
                "stars": pa.array(
                    [None if i % 5 == 0 else 1 + i % 4 for i in range(n)], pa.int64()
                ),
                "tag": [None if i % 7 == 0 else ("a", "b", "c")[i % 3] for i in range(n)],
            }
        ),
    )


def test_not_in_over_nulls_keeps_datafusions_rows(capsys, home, storage_root, tmp_path, reviews):  # noqa: F811
    """``NOT (stars IN (1, 2))`` is NULL, so dropped, where stars is NULL (SQL), not kept."""
    path = tmp_path / "t"
    _nulls_table(path, reviews)
    where = "NOT (stars IN (1, 2))"
    code, out, err = _add(
        capsys,
        home,
        "k",
        "--source",
        f"delta:{path}",
        "--where",
        where,
        "--text-column",
        "review_text",
    )
    assert code == 0, err
    meta, _ = _raw(storage_root, "k")
    expected = _datafusion(path, "review_text", where)
    assert (
        meta["rows_in"]
        == len(expected)
        == sum(1 for i in range(len(reviews)) if i % 5 and 1 + i % 4 not in (1, 2))
    )


@pytest.mark.parametrize(
    "where, expect",
    [
        ("stars = 1e30", "outside the range of 'stars'"),
        ("stars = review_text", "their types differ"),
        ("stars = 'many'", "not a integer value"),
        ("review_text LIKE 3", "not a string value"),
        ("stars = 1; DROP TABLE src", "not allowed in a row filter"),
        ("stars IN (SELECT 1)", "not allowed in a row filter"),
        ("1=1) OR (1=1", "not a SQL predicate"),
        ("count(stars) > 1", "not allowed in a row filter"),
        ("nope = 1", "no column 'nope'"),
    ],
)
def test_bad_where_is_refused_before_the_engine(capsys, home, tmp_path, reviews, where, expect):  # noqa: F811
    path = tmp_path / "t"
    _nulls_table(path, reviews[:20])
    code, _, err = _add(
        capsys,
        home,
        "k",
        "--source",
        f"delta:{path}",
        "--where",
        where,
        "--text-column",
        "review_text",
    )
    assert code != 0 and expect in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unknown_reader_feature_is_refused_by_name(tmp_path):
    path = tmp_path / "t"
    column_mapped_table(
        path,
        {"text": ["a review"], "label": ["Positive"]},
        physical={"text": "text", "label": "label"},
        mode="none",
        protocol={
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["madeUpFeature"],
            "writerFeatures": ["madeUpFeature"],
        },
    )
    with pytest.raises(SourceError, match="madeUpFeature"):
        read_source(SourceSpec(uri=f"delta:{path}"))


def test_storage_options_reach_delta_rs(tmp_path, monkeypatch):
    """An ``env:NAME`` option is read from the environment and handed to delta-rs: an S3 table
    at an endpoint nobody serves fails on that endpoint, not on missing credentials or region.
    """
    monkeypatch.setenv("FAKE_SECRET", "s3cr3t")
    spec = SourceSpec(
        uri="delta:s3://bucket/reviews",
        storage_options={
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "id",
            "AWS_SECRET_ACCESS_KEY": "env:FAKE_SECRET",
        },
    )
    with pytest.raises(SourceError) as err:
        read_source(spec)
    assert "127.0.0.1:9" in str(err.value) and "s3cr3t" not in str(err.value)
    monkeypatch.delenv("FAKE_SECRET")
    with pytest.raises(SourceError, match=r"\$FAKE_SECRET is not set"):
        read_source(spec)


# -- --where against DataFusion itself -----------------------------------------------------------

_INTS = st.sampled_from(["1", "2", "3", "4", "0", "-1", "NULL"])
_STRS = st.sampled_from(["'a'", "'b'", "'c'", "'z'", "NULL"])


def _atom() -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(
            lambda op, v: f"stars {op} {v}",
            st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="]),
            _INTS,
        ),
        st.builds(lambda op, v: f"tag {op} {v}", st.sampled_from(["=", "<>", "<", ">="]), _STRS),
        st.builds(
            lambda n, vs: f"stars {n}IN ({', '.join(vs)})",
            st.sampled_from(["", "NOT "]),
            st.lists(_INTS, min_size=1, max_size=3),
        ),
        st.builds(
            lambda n, vs: f"tag {n}IN ({', '.join(vs)})",
            st.sampled_from(["", "NOT "]),
            st.lists(_STRS, min_size=1, max_size=3),
        ),
        st.builds(
            lambda c, n: f"{c} IS {n}NULL",
            st.sampled_from(["stars", "tag"]),
            st.sampled_from(["", "NOT "]),
        ),
        st.builds(
            lambda n, a, b: f"stars {n}BETWEEN {a} AND {b}",
            st.sampled_from(["", "NOT "]),
            _INTS,
            _INTS,
        ),
        st.builds(
            lambda n, p: f"tag {n}LIKE {p}",
            st.sampled_from(["", "NOT "]),
            st.sampled_from(["'a%'", "'%'", "'_'", "NULL"]),
        ),
        st.sampled_from(["stars = stars", "TRUE", "FALSE", "NULL"]),
    )


_PREDICATES = st.recursive(
    _atom(),
    lambda inner: st.one_of(
        st.builds(
            lambda a, op, b: f"({a}) {op} ({b})", inner, st.sampled_from(["AND", "OR"]), inner
        ),
        st.builds(lambda a: f"NOT ({a})", inner),
    ),
    max_leaves=4,
)


@pytest.fixture(scope="module")
def nulls_table(tmp_path_factory, reviews) -> Path:
    path = tmp_path_factory.mktemp("where") / "t"
    _nulls_table(path, reviews[:40])
    return path


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(where=_PREDICATES)
def test_where_keeps_exactly_datafusions_rows(nulls_table, where):
    """Over nullable integer and string columns, every generated predicate keeps the rows
    DataFusion keeps for the same text, in the same order (or both refuse it).
    """
    try:
        expected = [r["review_text"] for r in _datafusion(nulls_table, "review_text", where)]
    except Exception:  # noqa: BLE001 - DataFusion refuses it: so must we
        expected = None
    spec = SourceSpec(
        uri=f"delta:{nulls_table}", text_column="review_text", label_column="polarity", where=where
    )
    try:
        got = read_source(spec).column("text").to_pylist()
    except SourceError:
        got = None
    assert got == expected, where


# -- change data: deletes and updates in place ---------------------------------------------------


@pytest.mark.parametrize("cdf", [True, False])
def test_delete_on_a_change_data_table_is_a_new_version(tmp_path, reviews, cdf):
    """A DELETE (then an UPDATE) is due at once on a table with a change data feed, and its
    version reads without the deleted rows; without the feed it is said, not silently skipped.
    """
    from deltalake import DeltaTable, write_deltalake

    from finetune_assets.core.sources.tables.delta_commits import due_versions

    path = tmp_path / "t"
    config = {"delta.enableChangeDataFeed": "true"} if cdf else None
    rows = reviews[:30]
    write_deltalake(
        path,
        pa.table({"text": [t for t, _ in rows], "label": [lab for _, lab in rows]}),
        configuration=config,
    )
    gone = rows[3][0]
    DeltaTable(path).delete(f"text = '{gone}'")  # version 1
    DeltaTable(path).update(updates={"label": "'Mixed'"}, predicate=f"text = '{rows[4][0]}'")
    notes: list[str] = []
    due, latest, _ = due_versions(str(path), 0, 0, min_new_rows=100, notes=notes)
    assert latest == 2
    if not cdf:
        assert due == [] and len(notes) == 2
        assert all("not a new version, rows changed in place" in n for n in notes)
        return
    assert due == [1, 2] and not notes
    texts = read_source(SourceSpec(uri=f"delta:{path}@version=1")).column("text").to_pylist()
    assert gone not in texts and len(texts) == len(rows) - 1
