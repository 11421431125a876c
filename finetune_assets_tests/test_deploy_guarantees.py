"""The Helm values and the instance file carry the same guarantees, and a real instance loads them.

``deploy/instance/dagster.yaml`` is the definition (Dagster's instance schema);
``deploy/values.yaml`` must say the same in the Helm chart's keys (camelCase under ``concurrency``
and ``dagsterDaemon``, rendered by the chart's ``configmap-instance.yaml`` / ``_concurrency.tpl``
into snake_case).
"""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import yaml

DEPLOY = Path(__file__).parents[1] / "deploy"
# Helm section -> instance section; everything under each is compared after camelCase -> snake_case.
SECTIONS = {
    ("concurrency",): "concurrency",
    ("dagsterDaemon", "runMonitoring"): "run_monitoring",
    ("dagsterDaemon", "runRetries"): "run_retries",
}
VERBATIM = {"value"}  # a tag limit's value ({applyLimitPerUniqueValue: true}) is camelCase in both


def _snake(node, verbatim: bool = False):
    if isinstance(node, list):
        return [_snake(item) for item in node]
    if not isinstance(node, dict) or verbatim:
        return node
    return {
        re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): _snake(v, k in VERBATIM)
        for k, v in node.items()
    }


def helm_as_instance(values: dict) -> dict:
    out = {}
    for path, section in SECTIONS.items():
        node = values
        for key in path:
            node = (node or {}).get(key)
        assert node is not None, (
            f"deploy/values.yaml has no {'.'.join(path)}: the Helm install lacks {section}"
        )
        out[section] = _snake(node)
    return out


def test_helm_values_and_instance_file_carry_the_same_guarantees():
    instance = yaml.safe_load((DEPLOY / "instance" / "dagster.yaml").read_text())
    values = yaml.safe_load((DEPLOY / "values.yaml").read_text())
    assert helm_as_instance(values) == {s: instance[s] for s in SECTIONS.values()}
    daemon = values["dagsterDaemon"]
    # The run queue enforces tag limits and pools only with the queued coordinator.
    assert daemon["runCoordinator"] == {"enabled": True, "type": "QueuedRunCoordinator"}


def test_the_instance_file_turns_each_guarantee_on(tmp_path):
    settings = yaml.safe_load((DEPLOY / "instance" / "dagster.yaml").read_text())
    with dg.instance_for_test(overrides=settings, temp_dir=str(tmp_path)) as instance:
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_start_timeout_seconds == 300
        assert instance.run_monitoring_cancel_timeout_seconds == 300
        assert (
            instance.run_retries_enabled and not instance.run_retries_retry_on_asset_or_op_failure
        )
        config = instance.get_concurrency_config()
        assert config.pool_config.default_pool_limit == 1
        limits = config.run_queue_config.tag_concurrency_limits
        assert limits == [
            {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
        ]


def test_a_difference_between_the_two_fails():
    values = yaml.safe_load((DEPLOY / "values.yaml").read_text())
    values["dagsterDaemon"]["runMonitoring"]["cancelTimeoutSeconds"] = 60
    instance = yaml.safe_load((DEPLOY / "instance" / "dagster.yaml").read_text())
    assert helm_as_instance(values) != {s: instance[s] for s in SECTIONS.values()}
