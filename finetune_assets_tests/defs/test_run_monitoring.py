"""With the deployment's instance settings, a run whose worker died is failed by run monitoring and
retried by the daemon's run retries; a cancelled run and an asset failure are not retried.

Dagster's own daemon functions decide (``monitor_started_run``, ``should_retry``); only the run
launcher is a double, standing in for ``K8sRunLauncher.check_run_worker_health``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import dagster as dg
import yaml
from dagster._core.launcher import CheckRunHealthResult, RunLauncher, WorkerStatus
from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
from dagster._core.storage.tags import RUN_FAILURE_REASON_TAG, WILL_RETRY_TAG
from dagster._core.utils import make_new_run_id
from dagster._daemon.auto_run_reexecution.auto_run_reexecution import should_retry
from dagster._daemon.monitoring.run_monitoring import monitor_started_run
from dagster._serdes import ConfigurableClass

from finetune_assets.definitions import defs as load_defs

INSTANCE_FILE = Path(__file__).parents[2] / "deploy" / "instance" / "dagster.yaml"


class DeadWorkerLauncher(RunLauncher, ConfigurableClass):
    """Fakes what ``K8sRunLauncher.check_run_worker_health`` reports for a run pod whose container
    was SIGKILLed (OOM, lost node): ``WorkerStatus.FAILED``. Launches nothing, terminates nothing.
    """

    def __init__(self, inst_data=None):
        self._inst_data = inst_data
        super().__init__()

    @classmethod
    def config_type(cls):
        return {}

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(inst_data=inst_data)

    @property
    def inst_data(self):
        return self._inst_data

    def launch_run(self, context) -> None:
        raise NotImplementedError

    def terminate(self, run_id: str) -> bool:
        return False

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run) -> CheckRunHealthResult:
        return CheckRunHealthResult(
            WorkerStatus.FAILED, "run pod: container terminated (OOMKilled)"
        )


def _instance(tmp_path):
    settings = yaml.safe_load(INSTANCE_FILE.read_text())
    settings["run_launcher"] = {"module": __name__, "class": "DeadWorkerLauncher"}
    return dg.instance_for_test(overrides=settings, temp_dir=str(tmp_path))


def _run(instance, status: DagsterRunStatus) -> DagsterRun:
    tags = {**load_defs().resolve_job_def("retrain_job").tags, "dagster/partition": "v1"}
    run = DagsterRun(job_name="retrain_job", run_id=make_new_run_id(), tags=tags, status=status)
    instance.add_run(run)
    return run


def test_a_dead_run_worker_is_failed_by_monitoring_and_retried(tmp_path):
    with _instance(tmp_path) as instance:
        # The daemon runs the monitoring loop only when enabled (off by default in open-source
        # Dagster).
        assert instance.run_monitoring_enabled
        # its worker was SIGKILLed: STARTED forever before
        run = _run(instance, DagsterRunStatus.STARTED)
        (record,) = instance.get_run_records(dg.RunsFilter(run_ids=[run.run_id]))
        monitor_started_run(instance, None, record, logging.getLogger("test"))
        failed = instance.get_run_by_id(run.run_id)
        assert failed.status == DagsterRunStatus.FAILURE
        # the daemon re-launches it (max_retries 2 on the job)
        assert should_retry(failed, instance)


def test_an_asset_failure_and_a_cancelled_run_are_not_retried(tmp_path):
    with _instance(tmp_path) as instance:
        step = _run(instance, DagsterRunStatus.FAILURE)
        instance.add_run_tags(step.run_id, {RUN_FAILURE_REASON_TAG: "STEP_FAILURE"})
        assert not should_retry(instance.get_run_by_id(step.run_id), instance)
        cancelled = _run(instance, DagsterRunStatus.CANCELED)
        assert not should_retry(instance.get_run_by_id(cancelled.run_id), instance)
        assert instance.get_run_by_id(cancelled.run_id).tags.get(WILL_RETRY_TAG) != "true"


def test_a_run_of_the_implicit_asset_job_is_retried_too(tmp_path):
    """Asset backfills and "Materialize" in the UI run the implicit asset job, without the jobs'
    retry tags: the instance's own default (``max_retries: 2``) covers them.
    """
    with _instance(tmp_path) as instance:
        run = DagsterRun(
            job_name="__ASSET_JOB",
            run_id=make_new_run_id(),
            tags={"dagster/partition": "v1"},
            status=DagsterRunStatus.FAILURE,  # its worker never started (launch timed out)
        )
        instance.add_run(run)
        assert should_retry(instance.get_run_by_id(run.run_id), instance)
