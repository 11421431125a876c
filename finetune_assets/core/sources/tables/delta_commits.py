"""Which commits of a watched Delta table add rows: the sensor turns those (not optimize or vacuum)
into dataset versions. Read from the commit history only, never from the data files.

A commit that deletes or updates rows in place (DELETE, UPDATE, MERGE) is a new dataset version
when the table keeps a change data feed (``delta.enableChangeDataFeed``): its change rows, read
with ``load_cdf``, say exactly which rows went, and the version at that commit is read without
them. Without the feed it is no version (deleted rows would otherwise leave training silently
either way): a note says "not a new version, rows changed in place".
"""

from __future__ import annotations

import logging

import pyarrow as pa

from finetune_assets.core.sources.tables.delta import DELTA_PREFIX, open_table

log = logging.getLogger(__name__)
CDF = "delta.enableChangeDataFeed"
# Operations that change existing rows where they are.
IN_PLACE = frozenset({"DELETE", "UPDATE", "MERGE"})
# Change rows of load_cdf that mean an existing row went away or changed.
GONE = ("delete", "update_preimage")

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


def rows_changed_in_place(table: str, dt, commit: dict) -> int | None:
    """Rows a DELETE / UPDATE / MERGE commit removed or rewrote, from its change data feed; None
    where the table kept no feed at that version (0 for other operations).
    """
    version = commit["version"]
    if commit.get("operation") not in IN_PLACE:
        return 0
    at = open_table(f"{DELTA_PREFIX}{table}@version={version}")
    if at.metadata().configuration.get(CDF, "false").lower() != "true":
        return None
    changes = pa.table(
        dt.load_cdf(
            starting_version=version, ending_version=version, columns=["_change_type"]
        ).read_all()
    )
    kinds = changes.column("_change_type").cast(pa.string()).to_pylist()
    return sum(kind in GONE for kind in kinds)


def due_versions(
    table: str,
    seen: int | None,
    pending_rows: int,
    min_new_rows: int,
    notes: list[str] | None = None,
) -> tuple[list[int], int, int]:
    """Table versions to register since version ``seen``: (versions, the latest version, rows
    carried over).

    A version is due once ``min_new_rows`` rows were added since the last due one (1: every
    row-adding commit), and at once at a commit whose change data feed shows rows deleted or
    updated in place; commits that add no rows only move ``seen`` on, an in-place change on a
    table without the feed with a note in ``notes`` (logged where no list is given). On first
    sight (``seen`` None) the table as it is now is due.
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
        changed = rows_changed_in_place(table, dt, commit)
        if changed:
            due.append(commit["version"])  # deleted rows must stop training: due whatever the count
            pending_rows = 0
            continue
        if changed is None:
            note = (
                f"{DELTA_PREFIX}{table}@version={commit['version']} ({commit['operation']}): not a "
                "new version, rows changed in place (set delta.enableChangeDataFeed = true on the "
                "table for a version per delete or update)"
            )
            if notes is None:
                log.warning(note)
            else:
                notes.append(note)
        rows = rows_added(commit)
        if rows == 0:
            continue
        pending_rows += min_new_rows if rows is None else rows
        if pending_rows >= min_new_rows:
            due.append(commit["version"])
            pending_rows = 0
    return due, latest, pending_rows
