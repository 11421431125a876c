"""Which commits of a watched Delta table add rows: the sensor turns those (not optimize or vacuum)
into dataset versions. Read from the commit history only, never from the data files.
"""

from __future__ import annotations

from finetune_assets.data.sources.delta import DELTA_PREFIX, open_table

# Operation metrics that count the rows a commit inserts, most specific first: delta-rs writes
# snake_case, Spark / Databricks camelCase (Delta docs, "Retrieve Delta table history", operation
# metrics keys). A MERGE's numOutputRows also counts the rows it copied, so the inserted-rows keys
# are looked at before it.
INSERTED = ("num_target_rows_inserted", "numTargetRowsInserted", "num_added_rows")
OUTPUT = (
    "numOutputRows"  # WRITE, CREATE/REPLACE TABLE AS SELECT, STREAMING UPDATE, COPY INTO (Spark)
)
# Operations that never add rows: file rewrites, deletes and updates in place, schema and log
# maintenance.
NO_ROWS = frozenset(
    {
        "OPTIMIZE",
        "VACUUM START",
        "VACUUM END",
        "DELETE",
        "UPDATE",
        "REORG",
        "FSCK",
        "FILESYSTEM CHECK",
        "SET TBLPROPERTIES",
        "UNSET TBLPROPERTIES",
        "ADD COLUMN",
        "ADD COLUMNS",
        "CHANGE COLUMN",
        "REPLACE COLUMNS",
        "ADD CONSTRAINT",
        "DROP CONSTRAINT",
        "ADD FEATURE",
        "UPGRADE PROTOCOL",
        "UPDATE FIELD METADATA",
        "UPDATE TABLE METADATA",
        "CREATE TABLE",
        "CHECKPOINT",
    }
)


def rows_added(commit: dict) -> int | None:
    """The rows one history entry inserted; None when its engine did not say (counted as
    row-adding).
    """
    metrics = commit.get("operationMetrics") or {}
    for key in INSERTED:
        if key in metrics:
            return int(metrics[key])
    if commit.get("operation") in NO_ROWS:
        return 0
    return int(metrics[OUTPUT]) if OUTPUT in metrics else None


def due_versions(
    table: str, seen: int | None, pending_rows: int, min_new_rows: int
) -> tuple[list[int], int, int]:
    """Table versions to register since version ``seen``: (versions, the latest version, rows
    carried over).

    A version is due once ``min_new_rows`` rows were added since the last due one (1: every
    row-adding commit); commits that add no rows only move ``seen`` on. On first sight (``seen``
    None) the table as it is now is due.
    """
    dt = open_table(DELTA_PREFIX + table)
    latest = dt.version()
    if seen is None:
        return [latest], latest, 0
    if latest <= seen:
        return [], seen, pending_rows
    due = []
    for commit in sorted(dt.history(limit=latest - seen), key=lambda c: c["version"]):
        if commit["version"] <= seen:
            continue
        rows = rows_added(commit)
        if rows == 0:
            continue
        pending_rows += min_new_rows if rows is None else rows
        if pending_rows >= min_new_rows:
            due.append(commit["version"])
            pending_rows = 0
    return due, latest, pending_rows
