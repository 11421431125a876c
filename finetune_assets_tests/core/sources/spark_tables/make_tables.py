"""Writes the Delta tables of this folder with real Spark + Delta (PyPI's ``delta-spark``, its
jars from Maven Central), and beside each table what Spark itself reads from it
(``<name>.expected.json``, the table's ``text`` and ``label`` rows). The tables and those files are
committed; CI reads them with our reader and compares (``test_spark_tables.py``): CI needs no JVM.

    python3 -m venv /tmp/sparkvenv && /tmp/sparkvenv/bin/pip install delta-spark==4.4.1
    /tmp/sparkvenv/bin/python finetune_assets_tests/core/sources/spark_tables/make_tables.py [NAME
    ...]

Tables (each small: a few KB of Parquet):
- ``mapped_name``: created plain, then ``delta.columnMapping.mode = name`` (reader 2 / writer 5, as
  Databricks' documented ``SET TBLPROPERTIES`` gives), then columns renamed so that the logical
  ``title`` is stored in the physical column ``text`` and the logical ``text`` in ``body``: a
  reader of physical names reads titles as reviews.
- ``deletion_vectors``: ``delta.enableDeletionVectors = true``, then a DELETE (rows masked by a
  deletion vector, the data file kept).
- ``checkpointed``: partitioned by ``lang``, 12 appends (a checkpoint at version 10), a column
  (``stars``) added half way by ``mergeSchema``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from delta import configure_spark_with_delta_pip
from pyspark.sql import SparkSession

HERE = Path(__file__).resolve().parent
LABELS = ["Positive", "Negative", "Mixed"]


def _rows(start: int, n: int) -> list[tuple[str, str, str]]:
    return [
        (
            f"review number {i}: the product was {'good' if i % 3 == 0 else 'poor'} overall",
            LABELS[i % 3],
            f"title {i}",
        )
        for i in range(start, start + n)
    ]


def _expected(spark, path: Path, name: str) -> None:
    rows = spark.read.format("delta").load(str(path)).select("text", "label").collect()
    out = sorted([r["text"], r["label"]] for r in rows)
    (HERE / f"{name}.expected.json").write_text(
        json.dumps(out, indent=0, ensure_ascii=False) + "\n"
    )


def main(names: list[str]) -> int:
    builder = (
        SparkSession.builder.appName("make_tables")
        .master("local[1]")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config("spark.ui.enabled", "false")
    )
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    if not names or "mapped_name" in names:
        _mapped_name(spark)
    if not names or "deletion_vectors" in names:
        _deletion_vectors(spark)
    if not names or "checkpointed" in names:
        _checkpointed(spark)
    spark.stop()
    for crc in HERE.rglob(".*.crc"):  # Hadoop's checksum files: not part of the tables
        crc.unlink()
    return 0


def _mapped_name(spark) -> None:
    columns = ["body", "label", "text"]  # physical names as created: 'text' will hold titles
    path = HERE / "mapped_name"
    shutil.rmtree(path, ignore_errors=True)
    spark.createDataFrame(_rows(0, 30), columns).coalesce(1).write.format("delta").save(str(path))
    t = f"delta.`{path}`"
    spark.sql(
        f"ALTER TABLE {t} SET TBLPROPERTIES ('delta.minReaderVersion' = '2', "
        "'delta.minWriterVersion' = '5', 'delta.columnMapping.mode' = 'name')"
    )
    spark.sql(f"ALTER TABLE {t} RENAME COLUMN text TO title")
    spark.sql(f"ALTER TABLE {t} RENAME COLUMN body TO text")
    spark.createDataFrame(_rows(30, 10), ["text", "label", "title"]).coalesce(1).write.format(
        "delta"
    ).mode("append").save(str(path))
    _expected(spark, path, "mapped_name")


def _deletion_vectors(spark) -> None:
    path = HERE / "deletion_vectors"
    shutil.rmtree(path, ignore_errors=True)
    spark.createDataFrame(_rows(0, 40), ["text", "label", "title"]).coalesce(1).write.format(
        "delta"
    ).option("delta.enableDeletionVectors", "true").save(str(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE label = 'Mixed' OR text LIKE '%number 1%'")
    _expected(spark, path, "deletion_vectors")


def _checkpointed(spark) -> None:
    from pyspark.sql import functions as F

    path = HERE / "checkpointed"
    shutil.rmtree(path, ignore_errors=True)
    for i in range(12):
        df = spark.createDataFrame(
            [(t, lab, ("ar", "en", "fr")[j % 3]) for j, (t, lab, _) in enumerate(_rows(i * 5, 5))],
            ["text", "label", "lang"],
        )
        if i >= 6:
            df = df.withColumn("stars", F.lit(i % 5 + 1))
        df.coalesce(1).write.format("delta").mode("append").partitionBy("lang").option(
            "mergeSchema", "true"
        ).save(str(path))
    _expected(spark, path, "checkpointed")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
