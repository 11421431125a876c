"""Each private Dagster name the code location uses (``finetune_assets/defs/dagster_internals.py``)
still
means what the code relies on: an upgrade that moves or changes one fails here.
"""

import dagster as dg

from finetune_assets.defs import dagster_internals as di

PARTS = dg.StaticPartitionsDefinition(["a", "b"])


class Version(dg.Config):
    v: str = "1"


@dg.asset(partitions_def=PARTS)
def upstream(context: dg.AssetExecutionContext, config: Version):
    return dg.MaterializeResult(data_version=dg.DataVersion(f"{context.partition_key}-{config.v}"))


@dg.asset(partitions_def=PARTS, deps=[upstream])
def downstream(config: Version) -> dg.MaterializeResult:
    if config.v == "1":
        return dg.MaterializeResult()
    key = dg.AssetKey("upstream")  # the input this step says it read (defs/provenance.py)
    return dg.MaterializeResult(
        tags={
            di.get_input_data_version_tag(key): "pinned",
            di.get_input_event_pointer_tag(key): di.NULL_EVENT_POINTER,
        }
    )


@dg.asset_check(asset=upstream, blocking=True, partitions_def=PARTS)
def upstream_ok(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=context.partition_key != "b", description="b is bad")


def _materialize(instance, selection, partition: str, v: str = "1"):
    everything = [upstream, downstream, upstream_ok]
    keys = dg.AssetSelection.all().resolve(everything) if selection == "*" else None
    keys = keys or selection.resolve(everything)
    names = {k.path[-1] for k in keys}
    return dg.materialize(
        everything,
        selection=selection,
        partition_key=partition,
        instance=instance,
        run_config={"ops": {k: {"config": {"v": v}} for k in names}},
        raise_on_error=False,
    )


def _latest(instance, key: str, partition: str):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition]), limit=1
    ).records
    return records[0].event_log_entry.asset_materialization


def test_data_version_tags_name_what_dagster_writes(instance):
    assert di.WILL_RETRY_TAG == "dagster/will_retry"
    assert _materialize(instance, "*", "a").success
    assert _latest(instance, "upstream", "a").tags[di.DATA_VERSION_TAG] == "a-1"
    up = dg.AssetKey("upstream")
    down = _latest(instance, "downstream", "a").tags
    assert di.get_input_data_version_tag(up) in down and di.get_input_event_pointer_tag(up) in down
    # An asset event's own input tags win over the step's: what provenance.py relies on.
    assert _materialize(instance, dg.AssetSelection.assets(downstream), "a", v="2").success
    down = _latest(instance, "downstream", "a").tags
    assert down[di.get_input_data_version_tag(up)] == "pinned"
    assert down[di.get_input_event_pointer_tag(up)] == di.NULL_EVENT_POINTER


def test_failed_check_evaluations_are_per_partition(instance):
    _materialize(instance, "*", "a")
    _materialize(instance, dg.AssetSelection.assets(upstream), "b")
    key = upstream_ok.check_key
    assert di.failed_check_evaluations(instance, [key], "a") == {}
    failed = di.failed_check_evaluations(instance, [key], "b")
    assert list(failed) == [key] and failed[key].description == "b is bad"


def test_stale_status_resolver_sees_a_new_upstream_version(instance):
    defs = dg.Definitions(assets=[upstream, downstream])
    assert _materialize(instance, "*", "a").success

    def status():
        resolver = di.stale_status_resolver(instance, defs.resolve_asset_graph())
        return resolver.get_status(dg.AssetKey("downstream"), "a")

    assert status() == di.StaleStatus.FRESH
    assert _materialize(instance, dg.AssetSelection.assets(upstream), "a", v="2").success
    assert status() == di.StaleStatus.STALE
