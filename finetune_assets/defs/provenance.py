"""Which upstream version a step read, kept the same across re-executions and told to Dagster; and
storage brought back in line with Dagster's record when a killed run left it ahead.

A re-execution ("from failure", or a daemon run retry) is a new run with the same *root* run: its
steps must read what the root run's steps read (the base model the shards were tokenized with), so
the storage pin is keyed on the root run id. Dagster records a step's input data versions when the
step starts, from the latest materialization; the pin may differ (a newer ``pretrained_model``
published meanwhile), so the materialization states the input actually used: Dagster lets an asset
event carry its own ``dagster/input_data_version/*`` and ``dagster/input_event_pointer/*`` tags
(``is_system_asset_event_tag``), and those win over the step's (``_get_output_asset_events``).
"""

from __future__ import annotations

import dagster as dg

from finetune_assets.core.io.storage import Published, Storage
from finetune_assets.defs.dagster_internals import (
    DATA_VERSION_TAG,
    NULL_EVENT_POINTER,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)

SEARCHED_RECORDS = 50  # newest materializations of an input searched for the version used


def run_group_id(run: dg.DagsterRun) -> str:
    """The root run of a re-execution chain (the run itself when it is no re-execution)."""
    return run.root_run_id or run.run_id


def input_tags(instance: dg.DagsterInstance, asset: str, used: Published) -> dict[str, str]:
    """Tags recording ``used`` (the published version this step read) as the input ``asset``.

    The event pointer names the Dagster materialization with that data version when one of the
    newest ``SEARCHED_RECORDS`` has it; otherwise it is null (never the newest one's: not what
    was read).
    """
    key = dg.AssetKey(asset)
    tags = {
        get_input_data_version_tag(key): used.data_version,
        get_input_event_pointer_tag(key): NULL_EVENT_POINTER,
    }
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key), limit=SEARCHED_RECORDS
    ).records
    for record in records:
        mat = record.event_log_entry.asset_materialization
        if mat is not None and (mat.tags or {}).get(DATA_VERSION_TAG) == used.data_version:
            tags[get_input_event_pointer_tag(key)] = str(record.storage_id)
            break
    return tags


def read_recorded(
    instance: dg.DagsterInstance, store: Storage, asset: str, partition: str | None = None
) -> Published:
    """The published version of ``asset`` that Dagster recorded, repairing ``CURRENT`` if ahead.

    A publish moves ``CURRENT`` inside the asset's body; Dagster records the materialization after
    the body returns. A run killed in between leaves storage ahead of the event log: ``CURRENT``
    names data no materialization describes. The next reader notices (the recorded data version
    differs) and points ``CURRENT`` back at the attempt Dagster recorded (kept as ``previous``).
    Storage with no Dagster record at all (published by a script or a test) is left as it is.
    """
    current = store.require(asset, partition)
    key = dg.AssetKey(asset)
    target = (
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]) if partition else key
    )
    records = instance.fetch_materializations(target, limit=1).records
    mat = records[0].event_log_entry.asset_materialization if records else None
    recorded = (mat.tags or {}).get(DATA_VERSION_TAG) if mat is not None else None
    if recorded is None or recorded == current.data_version:
        return current
    where = f"{asset}[{partition}]" if partition else asset
    for older in store.history(asset, partition)[1:]:
        if older.data_version == recorded:
            dg.get_dagster_logger().warning(
                f"{where}: storage was ahead of Dagster (attempt {current.attempt} published by "
                "a run that "
                f"died before recording it); restored the recorded attempt {older.attempt}"
            )
            return store.restore(asset, older.attempt, partition)
    raise dg.Failure(
        f"{where}: storage holds data version {current.data_version}, Dagster recorded "
        f"{recorded} and no kept attempt has it: re-materialize {where}",
        allow_retries=False,
    )
