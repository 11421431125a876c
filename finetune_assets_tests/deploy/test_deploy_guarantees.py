"""What a Helm install with ``deploy/values.yaml`` renders carries the instance file's guarantees.

``deploy/instance/dagster.yaml`` is the definition (Dagster's instance schema). The chart's
rendering rules for the keys we use are encoded in ``helm_chart_rules.py`` (each with the chart
template it was read from): the values are rendered by them and the result is compared with the
instance file, loaded into a real instance, and checked for keys the chart would drop.
"""

from __future__ import annotations

import copy
from pathlib import Path

import dagster as dg
import pytest
import yaml

from finetune_assets_tests.deploy.helm_chart_rules import (
    ChartRefusal,
    ignored_keys,
    render_instance,
)

DEPLOY = Path(__file__).parents[2] / "deploy"
SECTIONS = ("concurrency", "run_monitoring", "run_retries")


def _values() -> dict:
    return yaml.safe_load((DEPLOY / "values.yaml").read_text())


def _instance_file() -> dict:
    return yaml.safe_load((DEPLOY / "instance" / "dagster.yaml").read_text())


def test_the_chart_renders_the_instance_files_guarantees():
    rendered = render_instance(_values())
    instance = _instance_file()
    assert {s: rendered.get(s) for s in SECTIONS} == {s: instance[s] for s in SECTIONS}
    # The run queue enforces tag limits and pools only with the queued coordinator.
    assert rendered["run_coordinator"]["class"] == "QueuedRunCoordinator"


def test_no_key_in_the_values_is_one_the_chart_ignores():
    assert ignored_keys(_values()) == []


def test_without_concurrency_enabled_the_chart_drops_every_run_limit():
    values = _values()
    del values["concurrency"]["enabled"]
    assert "concurrency" not in render_instance(values)
    assert "concurrency.runs" in ignored_keys(values)


def test_keys_the_chart_never_reads_are_reported():
    values = _values()
    values["dagsterDaemon"]["runRetries"] = {"enabled": True, "retryOnAssetOrOpFailure": False}
    values["dagsterDaemon"]["runMonitoring"]["maxRuntimeSeconds"] = 60
    values["concurrency"]["pools"]["limit"] = 2
    assert set(ignored_keys(values)) == {
        "dagsterDaemon.runRetries.retryOnAssetOrOpFailure",
        "dagsterDaemon.runMonitoring.maxRuntimeSeconds",
        "concurrency.pools.limit",
    }


def test_a_difference_from_the_instance_file_fails():
    values = _values()
    values["dagsterDaemon"]["runMonitoring"]["cancelTimeoutSeconds"] = 60
    assert render_instance(values)["run_monitoring"] != _instance_file()["run_monitoring"]


def test_what_the_chart_refuses_is_refused():
    values = copy.deepcopy(_values())
    values["dagsterDaemon"]["runCoordinator"]["config"] = {
        "queuedRunCoordinator": {"maxConcurrentRuns": 2}
    }
    with pytest.raises(ChartRefusal, match="maxConcurrentRuns"):
        render_instance(values)
    values = _values()
    values["dagsterDaemon"]["runRetries"]["enabled"] = True  # and run_retries appended
    with pytest.raises(ChartRefusal, match="run_retries"):
        render_instance(values)


@pytest.mark.parametrize("source", ["chart", "instance file"])
def test_a_real_instance_turns_each_guarantee_on(tmp_path, source):
    settings = render_instance(_values()) if source == "chart" else _instance_file()
    with dg.instance_for_test(overrides=settings, temp_dir=str(tmp_path)) as instance:
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_start_timeout_seconds == 1200
        assert instance.run_monitoring_cancel_timeout_seconds == 300
        assert (
            instance.run_retries_enabled and not instance.run_retries_retry_on_asset_or_op_failure
        )
        assert instance.run_retries_max_retries == 2
        config = instance.get_concurrency_config()
        assert config.pool_config.default_pool_limit == 1
        assert config.run_queue_config.max_concurrent_runs == 4
        limits = config.run_queue_config.tag_concurrency_limits
        assert limits == [
            {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
        ]
