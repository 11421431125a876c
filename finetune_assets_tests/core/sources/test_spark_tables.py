"""Delta tables written by real Spark + Delta (``spark_tables/make_tables.py``: pyspark 4.0.1,
delta-spark 4.0.0, jars from Maven Central), committed with what Spark itself read from each.
Each is registered and materialized black-box (``versions add`` + ``raw_reviews``) and must give
Spark's rows exactly: column mapping by name with a decoy physical column (reader 2 / writer 5),
deletion vectors after a DELETE, a checkpoint after 12 commits with partitions and an added
column.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_assets_tests.core.sources.test_table_sources import _add, _raw, home  # noqa: F401

TABLES = Path(__file__).resolve().parent / "spark_tables"


@pytest.mark.parametrize("name", ["mapped_name", "deletion_vectors", "checkpointed"])
def test_spark_written_table_reads_as_spark_reads_it(capsys, home, storage_root, name):  # noqa: F811
    from deltalake import DeltaTable

    path = TABLES / name
    expected = [tuple(r) for r in json.loads((TABLES / f"{name}.expected.json").read_text())]
    table = DeltaTable(path)
    protocol = table.protocol()
    if name == "mapped_name":  # the shape the test is about, as Spark wrote it
        assert (protocol.min_reader_version, protocol.min_writer_version) == (2, 5)
        assert table.metadata().configuration["delta.columnMapping.mode"] == "name"
    elif name == "deletion_vectors":
        assert "deletionVectors" in (protocol.reader_features or [])
        log = [
            json.loads(line)
            for commit in sorted((path / "_delta_log").glob("*.json"))
            for line in commit.read_text().splitlines()
        ]
        assert any(
            (a.get("add") or {}).get("deletionVector") for a in log
        )  # rows masked, file kept
    else:
        assert (path / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()
        assert table.metadata().partition_columns == ["lang"]
    labels = ",".join(sorted({lab for _, lab in expected}))
    code, out, err = _add(capsys, home, name, "--source", f"delta:{path}", labels=labels)
    assert code == 0, err
    meta, published = _raw(storage_root, name)
    got = sorted(zip(published.column("text").to_pylist(), published.column("label").to_pylist()))
    assert meta["rows_in"] == len(expected) and meta["rejected_rows"] == 0
    assert got == sorted(expected)
