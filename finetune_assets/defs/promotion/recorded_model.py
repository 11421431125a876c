"""Which ``finetuned_model`` a gate or a promotion acts on: the one Dagster recorded for the run (or
its re-execution group), never whatever ``CURRENT`` points at by then.
"""

from dataclasses import dataclass

import dagster as dg

from finetune_assets.core.io.contracts import FINETUNED_MODEL


@dataclass(frozen=True)
class RecordedModel:
    """What one recorded ``finetuned_model`` materialization produced (Dagster's record, not
    ``CURRENT``).
    """

    run_id: str
    model_url: str
    registered_model_name: str | None
    registered_model_version: str | None


def recorded_model(instance: dg.DagsterInstance, version: str, run_id: str) -> RecordedModel:
    """The model materialized for ``version`` by run ``run_id`` or its re-execution group (a gate
    re-executed from failure runs in a new run); else the latest recorded one for ``version``.

    Checks and promotion act on the materialization they belong to: another run publishing the same
    partition in between (which moves ``CURRENT``) cannot swap the model under them.
    """
    key = dg.AssetKey(FINETUNED_MODEL)
    group = instance.get_run_group(run_id)
    ids = [r.run_id for r in group[1]] if group else [run_id]
    # Newest run of the re-execution group first (run records come newest first): a gate re-executed
    # from failure belongs to the model its group trained.
    records = instance.get_run_records(dg.RunsFilter(run_ids=ids))
    runs = [r.dagster_run.run_id for r in records] or ids
    entries = []
    for rid in runs:
        logs = instance.all_logs(rid, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        entries = [
            e
            for e in logs
            if e.asset_materialization
            and e.asset_materialization.asset_key == key
            and e.asset_materialization.partition == version
        ]
        if entries:
            break
    if not entries:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[version]), limit=1
        ).records
        entries = [r.event_log_entry for r in records]
    if not entries:
        raise dg.Failure(
            f"finetuned_model[{version}] has never been materialized: materialize it first",
            allow_retries=False,
        )
    entry = entries[-1]
    meta = entry.asset_materialization.metadata
    path = meta.get("model_path")
    name = meta.get("registered_model_name")
    number = meta.get("registered_model_version")
    return RecordedModel(
        run_id=entry.run_id,
        model_url=str(path.value) if path else "",
        registered_model_name=str(name.value) if name else None,
        registered_model_version=str(number.value) if number else None,
    )
