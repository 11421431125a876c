"""``iceberg:`` sources black-box through ``versions add`` + ``raw_reviews``, against a real
pyiceberg SQL catalog (SQLite) with its warehouse in ``tmp_path``: registered at a snapshot,
immutable after a new append, a row filter, exact accounting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from finetune_assets_tests.conftest import _real_rows
from finetune_assets_tests.core.sources.test_table_sources import _add, _raw, home  # noqa: F401

pytest.importorskip("pyiceberg")


@pytest.fixture(scope="module")
def reviews(arabic_reviews: Path) -> list[tuple[str, str]]:
    rows = [(t, lab) for t, lab in _real_rows(arabic_reviews / "PROD.csv")]
    return [(f"{t} ({i})", lab) for i, (t, lab) in enumerate(rows)]  # no duplicates


def _batch(rows: list[tuple[str, str]], first_stars: int = 0) -> pa.Table:
    return pa.table(
        {
            "review": pa.array([t for t, _ in rows], pa.string()),
            "sentiment": pa.array([lab for _, lab in rows], pa.string()),
            "stars": pa.array([(first_stars + i) % 5 + 1 for i in range(len(rows))], pa.int64()),
        }
    )


@pytest.fixture()
def table(tmp_path: Path, reviews):
    from pyiceberg.catalog.sql import SqlCatalog

    uri = f"sqlite:///{tmp_path / 'catalog.db'}"
    catalog = SqlCatalog("test", uri=uri, warehouse=f"file://{tmp_path / 'warehouse'}")
    catalog.create_namespace("shop")
    first = _batch(reviews[:40])
    tbl = catalog.create_table("shop.reviews", schema=first.schema)
    tbl.append(first)
    return f"iceberg:{uri}#test/shop.reviews", tbl


def _record(home, key: str) -> dict:  # noqa: F811
    return json.loads(Path(home["store"].url("versions", f"{key}.json")).read_text())


def test_iceberg_snapshot_is_pinned_and_immutable_after_an_append(
    capsys,
    home,  # noqa: F811
    storage_root,
    table,
    reviews,
):
    """Registered at the current snapshot; an append after it leaves that version's rows exactly
    as they were (re-read at the pinned snapshot); a key registered after the append sees both.
    """
    source, tbl = table
    snapshot = tbl.current_snapshot().snapshot_id
    code, out, err = _add(capsys, home, "ice1", "--source", source)
    assert code == 0, err
    assert _record(home, "ice1")["source"]["uri"] == f"{source}@snapshot={snapshot}"
    meta, first = _raw(storage_root, "ice1")
    assert meta["rows_in"] == 40
    assert meta["dagster/row_count"] + meta["rejected_rows"] == 40
    tbl.append(_batch(reviews[40:65], 40))
    meta, again = _raw(storage_root, "ice1")  # re-materialized after the append
    assert meta["rows_in"] == 40
    assert sorted(again.column("text").to_pylist()) == sorted(first.column("text").to_pylist())
    code, out, err = _add(capsys, home, "ice2", "--source", source)
    assert code == 0, err
    meta, both = _raw(storage_root, "ice2")
    assert meta["rows_in"] == 65


def test_iceberg_row_filter_keeps_exactly_the_matching_rows(
    capsys,
    home,  # noqa: F811
    storage_root,
    table,
    reviews,
):
    """``--where`` parsed and bound by pyiceberg: exactly the rows it matches are read; a filter on
    a column the table lacks is refused at registration, nothing registered.
    """
    source, _ = table
    code, out, err = _add(capsys, home, "ice3", "--source", source, "--where", "stars >= 4")
    assert code == 0, err
    meta, _ = _raw(storage_root, "ice3")
    assert meta["rows_in"] == sum(1 for i in range(40) if i % 5 + 1 >= 4)
    code, out, err = _add(capsys, home, "ice4", "--source", source, "--where", "nope = 1")
    assert code != 0 and "nope" in err
    assert not Path(home["store"].url("versions", "ice4.json")).exists()
