"""Watched Delta tables (``LandingZoneResource.delta_tables``): each row-adding commit (or each
``min_new_rows`` rows) of a table becomes the dataset version ``{name}-v{table version}``, pinned to
that table version; optimize and vacuum commits add no rows and register nothing.
"""

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.labels.infer import LabelSet
from finetune_assets.core.sources import DELTA_PREFIX, SourceError, SourceSpec, check_source
from finetune_assets.core.sources.tables.delta import VersionGone
from finetune_assets.core.sources.tables.delta_commits import due_versions
from finetune_assets.defs.versions.cursor import LandingCursor
from finetune_assets.defs.versions.landing import WatchedDeltaTable
from finetune_assets.defs.versions.partitions import InvalidVersionKey, validate_version_key
from finetune_assets.defs.versions.register import record_landed


def consider_table(
    store: Storage,
    cursor: LandingCursor,
    existing: set[str],
    watched: WatchedDeltaTable,
    problems: dict[str, str],
    new_partitions: list[str],
) -> None:
    """A watched Delta table: a version per row-adding commit (or ``min_new_rows``), pinned."""
    state = cursor.tables.get(watched.name, {})
    notes: list[str] = []  # in-place deletes / updates on a table without change data feed
    due, seen, rows = due_versions(
        watched.table, state.get("seen"), state.get("rows", 0), watched.min_new_rows, notes=notes
    )
    for note in notes:  # "<uri>@version=N (OPERATION): why": reported once, at the tick that saw it
        where, why = note.split(" ", 1)
        problems[where] = why
    labels = LabelSet(tuple(watched.labels)) if watched.labels else None
    for version in due:
        key, fp = f"{watched.name}-v{version}", f"delta-v{version}"
        if key in existing:  # cursor reset, or registered by the CLI
            continue
        spec = SourceSpec(
            uri=f"{DELTA_PREFIX}{watched.table}@version={version}",
            text_column=watched.text_column,
            label_column=watched.label_column,
            where=watched.where,
        )
        try:
            validate_version_key(key)
            check_source(spec)
        except VersionGone as err:  # vacuumed before this tick saw it; later ones may be readable
            problems[f"{DELTA_PREFIX}{watched.table}@version={version}"] = str(err)
            continue
        except (InvalidVersionKey, SourceError) as err:
            problems[DELTA_PREFIX + watched.table] = str(err)
            return  # the cursor stays: the same versions are tried again once the config is fixed
        why = record_landed(store, key, spec, None, labels)
        if why:
            problems[DELTA_PREFIX + watched.table] = why
            return
        cursor.registered[key] = {"fp": fp, "sig": ""}
        new_partitions.append(key)
    cursor.tables[watched.name] = {"seen": seen, "rows": rows}
