"""Run a launcher inside a real Dagster materialization and collect everything it logged."""

import re
import time
from dataclasses import dataclass

import dagster as dg

from finetune_assets.core.launchers import TrainingSpec
from finetune_assets.defs.resources.launchers import TrainingLauncher


@dataclass
class Launched:
    success: bool
    logs: str  # every Dagster event message of the run, step failure errors included
    job_name: str | None  # the Kubernetes Job/Service name the launcher chose
    seconds: float


def launch_in_dagster(
    launcher: TrainingLauncher,
    config_url: str,
    instance: dg.DagsterInstance,
    *,
    env: dict[str, str] | None = None,
    partition: str = "v1",
) -> Launched:
    @dg.asset(name="trained")
    def trained(context: dg.AssetExecutionContext, launcher: TrainingLauncher) -> None:
        launcher.launch(
            context,
            TrainingSpec(
                name=f"trained-{partition}-{context.run.run_id[:8]}",
                config_url=config_url,
                labels={
                    "dagster/run-id": context.run.run_id,
                    "dagster/asset": "trained",
                    "dagster/partition": partition,
                },
                env=env or {},
            ),
        )

    start = time.monotonic()
    result = dg.materialize(
        [trained], resources={"launcher": launcher}, instance=instance, raise_on_error=False
    )
    seconds = time.monotonic() - start
    lines = []
    for entry in instance.all_logs(result.run_id):
        lines.append(entry.user_message or "")
        data = entry.dagster_event.event_specific_data if entry.dagster_event else None
        error = getattr(data, "error", None)
        if error is not None:
            lines.append(error.to_string())
    logs = "\n".join(lines)
    m = re.search(r"Launching training Job [^/\s]+/(\S+):", logs)
    return Launched(result.success, logs, m.group(1) if m else None, seconds)
