"""With the deployment's instance settings, Dagster's run queue starts every version's data
preparation while one version trains, and never starts a second training: the waiting for the
``training`` slot happens in the queue, not in a run pod that holds a node and does nothing.

Everything is Dagster's own: the automation sensor's requests (``automation_ticks.Ticks``: the
conditions evaluated by Dagster, the runs built by the daemon's function) become runs as the sensor
daemon makes them (``create_run_for_job``, which records each run's pools), and the queue
coordinator daemon's
decision (``QueuedRunCoordinatorDaemon._get_runs_to_dequeue``, op-granularity pools,
``op_granularity_run_buffer: 0``) picks what to launch; launching is only recorded (no process).
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)

from finetune_assets.core.io.contracts import FINETUNED_MODEL, PRETRAINED_MODEL
from finetune_assets.definitions import build_defs
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets_tests.defs.automation_ticks import DATA, Ticks

INSTANCE_FILE = Path(__file__).parents[2] / "deploy" / "instance" / "dagster.yaml"
# Where a queued run's code lives (the daemon reads only its location name)
ORIGIN = RemoteJobOrigin(
    repository_origin=RemoteRepositoryOrigin(
        code_location_origin=InProcessCodeLocationOrigin(
            LoadableTargetOrigin(module_name="finetune_assets.definitions"),
            location_name="finetune_assets",
        ),
        repository_name="__repository__",
    ),
    job_name="retrain_job",
)


class Queue:
    """The sensor daemon (run requests -> queued runs) and the run queue daemon (what to launch)."""

    def __init__(self, instance, storage_root: Path):
        self.instance = instance
        self.job = build_defs(str(storage_root)).resolve_job_def("retrain_job")
        self.coordinator = QueuedRunCoordinatorDaemon(interval_seconds=60)

    def submit(self, request: dg.RunRequest) -> dg.DagsterRun:
        run = self.instance.create_run_for_job(
            job_def=self.job,
            asset_selection=frozenset(request.asset_selection),
            tags={
                **self.job.tags,
                **request.tags,
                "dagster/partition": request.partition_key,
            },
            status=dg.DagsterRunStatus.QUEUED,
            remote_job_origin=ORIGIN,
        )
        return run

    def dequeue(self) -> list[dg.DagsterRun]:
        """What the queue launches now; each is marked STARTED, as its run worker would."""
        batch = self.coordinator._get_runs_to_dequeue(  # noqa: SLF001 - the daemon's own decision
            self.instance, self.instance.get_concurrency_config(), fixed_iteration_time=None
        )
        for run in batch:
            self._event(run, DagsterEventType.RUN_START)
        return batch

    def finish(self, run: dg.DagsterRun) -> None:
        self.instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        self._event(run, DagsterEventType.RUN_SUCCESS)

    def _event(self, run: dg.DagsterRun, event: DagsterEventType) -> None:
        self.instance.report_dagster_event(
            DagsterEvent(event_type_value=event.value, job_name=run.job_name), run_id=run.run_id
        )


def _trains(run: dg.DagsterRun) -> bool:
    return dg.AssetKey(FINETUNED_MODEL) in (run.asset_selection or ())


def test_data_preparation_proceeds_while_one_version_trains_and_trainings_queue(
    tmp_path, storage_root
):
    settings = yaml.safe_load(INSTANCE_FILE.read_text())
    with dg.instance_for_test(overrides=settings, temp_dir=str(tmp_path)) as instance:
        automation = Ticks(instance, build_defs(str(storage_root)))
        queue = Queue(instance, storage_root)
        automation.ran([PRETRAINED_MODEL], None)
        automation.tick()
        # v1 trains: its run started and its finetuned_model step holds the one training slot
        instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
        automation.tick()
        automation.ran(DATA, "v1")
        automation.tick()
        (training_v1,) = [queue.submit(r) for r in automation.run_requests()]
        assert _trains(training_v1)
        assert queue.dequeue() == [training_v1]
        slot = instance.event_log_storage.claim_concurrency_slot(
            "training", training_v1.run_id, FINETUNED_MODEL
        )
        assert slot.is_claimed

        # Two versions land while v1 trains: their data preparation starts at once ...
        instance.add_dynamic_partitions(DATASET_VERSIONS, ["v2", "v3"])
        automation.tick()
        prepare = [queue.submit(r) for r in automation.run_requests()]
        started = queue.dequeue()
        assert sorted(r.tags["dagster/partition"] for r in started) == ["v2", "v3"]
        # ... and no run that would wait for the training slot was started (an idle run pod)
        assert not any(_trains(r) for r in started), "a run pod waits for the training slot"

        for run in prepare:
            queue.finish(run)
            automation.ran(DATA, run.tags["dagster/partition"])
        automation.tick()
        trainings = [queue.submit(r) for r in automation.run_requests()]
        assert sorted(r.tags["dagster/partition"] for r in trainings) == ["v2", "v3"]
        assert all(_trains(r) for r in trainings)
        assert queue.dequeue() == []  # queued, holding no pod, while v1 trains

        queue.finish(training_v1)  # v1's training ends: its slot is free
        (next_training,) = queue.dequeue()  # exactly one training starts
        assert next_training.run_id == trainings[0].run_id
        assert queue.dequeue() == []  # the other waits for that one
