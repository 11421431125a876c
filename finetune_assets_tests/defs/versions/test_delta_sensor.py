"""The new-data sensor follows a watched Delta table: one dataset version per row-adding commit."""

from pathlib import Path

import pyarrow as pa
import pytest

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.sources.tables.delta_commits import due_versions, rows_added
from finetune_assets.defs.versions.landing import LandingZoneResource, WatchedDeltaTable
from finetune_assets.defs.versions.register import read_version
from finetune_assets_tests.defs.versions.test_sensors import Daemon, _publish_base


def _rows(start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "text": [f"review number {i}, quite good" for i in range(start, start + n)],
            "label": ["Positive" if i % 2 else "Negative" for i in range(start, start + n)],
        }
    )


def test_one_version_per_row_adding_commit(instance, tmp_path: Path, storage_root: Path):
    from deltalake import DeltaTable, write_deltalake

    table = tmp_path / "reviews"
    write_deltalake(table, _rows(0, 10))  # version 0
    _publish_base(storage_root)
    daemon = Daemon(instance, tmp_path / "landing", storage_root)
    daemon.resources["landing"] = LandingZoneResource(
        url=str(tmp_path / "landing"),
        delta_tables=[WatchedDeltaTable(name="reviews", table=str(table))],
    )

    added, runs, _ = daemon.tick()
    assert added == ["reviews-v0"]
    assert daemon.tick()[:2] == ([], [])  # nothing new: nothing registered

    write_deltalake(table, _rows(10, 5), mode="append")  # 1
    write_deltalake(table, _rows(15, 5), mode="append")  # 2
    added, runs, _ = daemon.tick()
    assert added == ["reviews-v1", "reviews-v2"]
    record = read_version(Storage(str(storage_root)), "reviews-v2")
    assert record.source.uri == f"delta:{table}@version=2"

    DeltaTable(table).optimize.compact()  # 3: rewrites files, adds no rows
    # 4, 5
    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    DeltaTable(table).delete("text = 'review number 0, quite good'")  # 6: removes rows only
    added, runs, skip = daemon.tick()
    assert (added, runs) == ([], [])
    # No change data feed: the delete is no new version, and the tick says so (skip reason + log)
    assert f"delta:{table}@version=6: (DELETE): not a new version, rows changed in place" in skip
    assert "delta.enableChangeDataFeed" in skip
    assert "version=6" not in (daemon.tick()[2] or "")  # said once, at the tick that saw it

    write_deltalake(table, _rows(20, 1), mode="append")  # 7
    # 8, vacuumed away before the sensor sees it
    write_deltalake(table, _rows(21, 1), mode="append")
    write_deltalake(table, _rows(22, 1), mode="overwrite")  # 9
    # 10, 11
    DeltaTable(table).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    added, _, skip = daemon.tick()
    # 7 and 8 cannot be read any more: said in the log, not registered
    assert added == ["reviews-v9"]
    assert daemon.tick()[:2] == ([], [])


def test_min_new_rows_batches_commits(tmp_path: Path):
    from deltalake import write_deltalake

    table = tmp_path / "t"
    write_deltalake(table, _rows(0, 4))
    due, seen, carried = due_versions(str(table), None, 0, min_new_rows=10)
    assert (due, seen, carried) == ([0], 0, 0)
    for start in range(4, 28, 4):  # versions 1..6, four rows each
        write_deltalake(table, _rows(start, 4), mode="append")
    due, seen, carried = due_versions(str(table), 0, 0, min_new_rows=10)
    assert (due, seen, carried) == ([3, 6], 6, 0)  # 12 rows by version 3, 12 more by version 6


@pytest.mark.parametrize(
    "commit, rows",
    [
        ({"operation": "WRITE", "operationMetrics": {"num_added_rows": 3}}, 3),  # delta-rs
        ({"operation": "WRITE", "operationMetrics": {"numOutputRows": "7"}}, 7),  # Spark
        (
            {
                "operation": "MERGE",
                "operationMetrics": {"numTargetRowsInserted": "2", "numOutputRows": "90"},
            },
            2,
        ),
        ({"operation": "OPTIMIZE", "operationMetrics": {"numAddedFiles": "1"}}, 0),
        ({"operation": "VACUUM END", "operationMetrics": {}}, 0),
        # unknown: counted as adding rows, never silently skipped
        (
            {"operation": "SOMETHING NEW"},
            None,
        ),
    ],
)
def test_rows_added_by_engine_metrics(commit, rows):
    assert rows_added(commit) == rows
