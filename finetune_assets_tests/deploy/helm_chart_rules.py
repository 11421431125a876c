"""What the official Dagster Helm chart renders into the instance's ``dagster.yaml``, for the keys
``deploy/values.yaml`` uses: the chart's own template rules, encoded, so a test can assert what an
install gets rather than compare key names.

Read from the chart source in github.com/dagster-io/dagster (``helm/dagster``; the chart installed
is ``--version 1.13.27``, matching the pinned dagster 1.13.27). Templates are Go templates: a value
that is unset renders nothing where the template says ``if`` / ``kindIs "invalid"``, and a key the
template never reads is dropped silently, which is what ``ignored_keys`` reports.

- ``templates/helpers/instance/_concurrency.tpl`` @ 99dc34fc9b04: ``pools`` (``defaultLimit``,
  ``granularity``, ``opGranularityRunBuffer``) and ``runs`` (``maxConcurrentRuns``,
  ``tagConcurrencyLimits`` as key/value/limit), and the refusal of a queued-coordinator config that
  sets the same limits;
- ``schema/.../subschema/concurrency.py`` @ 0f2d9d8ee175 (-> ``values.schema.json``):
  ``concurrency.enabled: bool = False``, the gate: the instance gets ``concurrency:`` only with
  ``enabled: true``;
- ``templates/configmap-instance.yaml`` @ 835892b45aaa: ``run_coordinator`` only under
  ``dagsterDaemon.enabled`` and ``dagsterDaemon.runCoordinator.enabled``; ``run_monitoring``
  (enabled, start/cancel timeouts, max resume attempts, poll interval, slots freed after run end)
  and ``run_retries`` (``enabled``, ``maxRetries`` only when non-zero) under their ``enabled``;
  ``additionalInstanceConfig`` appended verbatim;
- ``templates/helpers/instance/_run-coordinator.tpl`` @ 7b8754699eee: the queued coordinator's
  ``config`` only when a value under ``queuedRunCoordinator`` is set;
- the chart's ``values.yaml``: ``dagsterDaemon.enabled`` defaults to true.

``runRetries.retryOnAssetOrOpFailure`` is a field of the newer chart schema (``daemon.py``
``RunRetries``) but the template read above never renders it, and Dagster's own default is *true*
(asset failures retried). So ``deploy/values.yaml`` turns the chart's ``runRetries`` block off and
gives the whole ``run_retries`` section through ``additionalInstanceConfig``, which renders the same
under either template.
"""

from __future__ import annotations

from typing import Any

CHART_VERSION = "1.13.27"
DAEMON_ENABLED_DEFAULT = True  # chart values.yaml: dagsterDaemon.enabled

POOL_KEYS = {
    "defaultLimit": "default_limit",
    "granularity": "granularity",
    "opGranularityRunBuffer": "op_granularity_run_buffer",
}
RUN_MONITORING_KEYS = {  # configmap-instance.yaml, in its order
    "enabled": "enabled",
    "startTimeoutSeconds": "start_timeout_seconds",
    "cancelTimeoutSeconds": "cancel_timeout_seconds",
    "maxResumeRunAttempts": "max_resume_run_attempts",
    "pollIntervalSeconds": "poll_interval_seconds",
    "freeSlotsAfterRunEndSeconds": "free_slots_after_run_end_seconds",
}
RUN_RETRIES_KEYS = {"enabled": "enabled", "maxRetries": "max_retries"}
RUN_COORDINATOR_KEYS = {"enabled", "type", "config"}


class ChartRefusal(ValueError):
    """What the chart's ``fail`` calls (or YAML) would refuse at ``helm template`` time."""


def _get(node: Any, *path: str) -> Any:
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _concurrency(values: dict) -> dict | None:
    conc = values.get("concurrency") or {}
    if not conc.get("enabled", False):
        return None
    pools, runs = conc.get("pools") or {}, conc.get("runs") or {}
    coord = _get(values, "dagsterDaemon", "runCoordinator") or {}
    if coord.get("enabled") and coord.get("type") == "QueuedRunCoordinator":
        qrc = _get(coord, "config", "queuedRunCoordinator") or {}
        if runs.get("maxConcurrentRuns") is not None and qrc.get("maxConcurrentRuns") is not None:
            raise ChartRefusal("both concurrency.runs.maxConcurrentRuns and the coordinator's")
        if runs.get("tagConcurrencyLimits") and qrc.get("tagConcurrencyLimits"):
            raise ChartRefusal("both concurrency.runs.tagConcurrencyLimits and the coordinator's")
    out: dict = {}
    rendered_pools = {
        snake: pools[k]
        for k, snake in POOL_KEYS.items()
        if (pools.get(k) if k == "granularity" else pools.get(k) is not None)
    }
    if rendered_pools:
        out["pools"] = rendered_pools
    rendered_runs: dict = {}
    if runs.get("maxConcurrentRuns") is not None:
        rendered_runs["max_concurrent_runs"] = runs["maxConcurrentRuns"]
    if runs.get("tagConcurrencyLimits"):
        rendered_runs["tag_concurrency_limits"] = [
            {"key": str(lim["key"]), **({"value": lim["value"]} if lim.get("value") else {})}
            | {"limit": lim["limit"]}
            for lim in runs["tagConcurrencyLimits"]
        ]
    if rendered_runs:
        out["runs"] = rendered_runs
    return out


def render_instance(values: dict) -> dict:
    """The instance sections the chart renders from ``values`` (the keys this project uses)."""
    daemon = values.get("dagsterDaemon") or {}
    daemon_on = daemon.get("enabled", DAEMON_ENABLED_DEFAULT)
    out: dict = {}
    concurrency = _concurrency(values)
    if concurrency is not None:
        out["concurrency"] = concurrency
    coord = daemon.get("runCoordinator") or {}
    if daemon_on and coord.get("enabled"):
        if coord.get("type") != "QueuedRunCoordinator":
            raise ChartRefusal(f"run coordinator type {coord.get('type')!r} is not encoded here")
        out["run_coordinator"] = {
            "module": "dagster.core.run_coordinator",
            "class": "QueuedRunCoordinator",
        }
        qrc = _get(coord, "config", "queuedRunCoordinator") or {}
        if any(v not in (None, "", [], {}) for v in qrc.values()):
            raise ChartRefusal("queuedRunCoordinator config is not encoded here: use concurrency")
    monitoring = daemon.get("runMonitoring") or {}
    if daemon_on and monitoring.get("enabled"):
        out["run_monitoring"] = {
            snake: monitoring.get(k)
            for k, snake in RUN_MONITORING_KEYS.items()
            if k not in ("cancelTimeoutSeconds", "maxResumeRunAttempts") or k in monitoring
        }
    retries = daemon.get("runRetries") or {}
    if daemon_on and retries.get("enabled"):
        out["run_retries"] = {"enabled": True}
        if retries.get("maxRetries"):
            out["run_retries"]["max_retries"] = retries["maxRetries"]
    for key, section in (values.get("additionalInstanceConfig") or {}).items():
        if key in out:  # appended after the rendered sections: a duplicate YAML key
            raise ChartRefusal(f"additionalInstanceConfig repeats the rendered section {key!r}")
        out[key] = section
    return out


def ignored_keys(values: dict) -> list[str]:
    """Keys under the sections the chart renders from that no template reads: set, but dropped."""
    ignored: list[str] = []

    def extra(node: Any, allowed: set[str], where: str) -> None:
        for key in (node or {}) if isinstance(node, dict) else ():
            if key not in allowed:
                ignored.append(f"{where}.{key}")

    conc = values.get("concurrency")
    if conc is not None:
        if not conc.get("enabled", False):
            ignored += [f"concurrency.{k}" for k in conc if k != "enabled"]
        extra(conc, {"enabled", "pools", "runs"}, "concurrency")
        extra(conc.get("pools"), set(POOL_KEYS), "concurrency.pools")
        extra(conc.get("runs"), {"maxConcurrentRuns", "tagConcurrencyLimits"}, "concurrency.runs")
        for i, lim in enumerate(_get(conc, "runs", "tagConcurrencyLimits") or []):
            extra(lim, {"key", "value", "limit"}, f"concurrency.runs.tagConcurrencyLimits[{i}]")
    daemon = values.get("dagsterDaemon") or {}
    extra(daemon.get("runCoordinator"), RUN_COORDINATOR_KEYS, "dagsterDaemon.runCoordinator")
    for name, allowed in (
        ("runMonitoring", set(RUN_MONITORING_KEYS)),
        ("runRetries", set(RUN_RETRIES_KEYS)),
    ):
        block = daemon.get(name)
        if block is None:
            continue
        if not block.get("enabled"):
            ignored += [f"dagsterDaemon.{name}.{k}" for k in block if k != "enabled"]
        extra(block, allowed, f"dagsterDaemon.{name}")
    return ignored
