"""benchmark_scores[v] is materialized by automation once its model and baseline for v are."""

from __future__ import annotations

import dagster as dg

from finetune_assets.dataset_versions.partitions import DATASET_VERSIONS
from finetune_assets.definitions import build_defs

BENCHMARKS = dg.AssetKey("benchmark_scores")


def test_benchmark_scores_requested_once_model_and_baseline_are_materialized(tmp_path, instance):
    defs = build_defs(str(tmp_path / "root"))
    sensor = defs.get_sensor_def("benchmark_automation")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1", "v2"])
    selection = dg.AssetSelection.assets(BENCHMARKS)

    tick = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, asset_selection=selection
    )
    assert tick.total_requested == 0  # nothing to score yet

    for upstream in ("finetuned_model", "baseline_model"):
        instance.report_runless_asset_event(dg.AssetMaterialization(upstream, partition="v1"))
    tick = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, asset_selection=selection, cursor=tick.cursor
    )
    assert tick.get_requested_partitions(BENCHMARKS) == {"v1"}  # v2 still waits for its model

    tick = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, asset_selection=selection, cursor=tick.cursor
    )
    assert tick.total_requested == 0  # requested once, not every tick
