"""Delta tables whose log is written here action by action, for protocol shapes delta-rs' writer
does not make: column mapping with a decoy physical column, a reader feature nobody knows.

The actions follow the Delta protocol (delta-io/delta PROTOCOL.md, "Column Mapping": logical
names in ``schemaString``, ``delta.columnMapping.physicalName`` / ``.id`` in each field's
metadata, Parquet columns named by physical name with the id as ``PARQUET:field_id``; reader 2 /
writer 5 is the protocol ``ALTER TABLE ... SET TBLPROPERTIES ('delta.columnMapping.mode' =
'name')`` gives on Databricks).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def column_mapped_table(
    path: Path,
    columns: dict[str, list],
    physical: dict[str, str],
    mode: str = "name",
    protocol: dict | None = None,
) -> None:
    """A one-file table: ``columns`` by logical name, stored under ``physical`` names."""
    (path / "_delta_log").mkdir(parents=True, exist_ok=True)
    names = list(columns)
    fields, arrow = [], []
    for i, name in enumerate(names, start=1):
        fields.append(
            {
                "name": name,
                "type": "string",
                "nullable": True,
                "metadata": {
                    "delta.columnMapping.id": i,
                    "delta.columnMapping.physicalName": physical[name],
                },
            }
        )
        arrow.append(
            pa.field(physical[name], pa.string(), metadata={b"PARQUET:field_id": str(i).encode()})
        )
    data = pa.Table.from_arrays(
        [pa.array(columns[n], pa.string()) for n in names], schema=pa.schema(arrow)
    )
    file = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(data, path / file)
    now = int(time.time() * 1000)
    actions = [
        {"protocol": protocol or {"minReaderVersion": 2, "minWriterVersion": 5}},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps({"type": "struct", "fields": fields}),
                "partitionColumns": [],
                "createdTime": now,
                "configuration": {
                    "delta.columnMapping.mode": mode,
                    "delta.columnMapping.maxColumnId": str(len(names)),
                },
            }
        },
        {
            "add": {
                "path": file,
                "partitionValues": {},
                "size": os.path.getsize(path / file),
                "modificationTime": now,
                "dataChange": True,
            }
        },
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE AS SELECT"}},
    ]
    (path / "_delta_log" / f"{0:020d}.json").write_text(
        "\n".join(json.dumps(a) for a in actions) + "\n"
    )
