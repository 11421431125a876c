"""Through the daemon: a landed version is registered by the sensor, then prepared, trained and
gated by the automation conditions alone; a refused gate shows as refused and is not retried; a
cancelled run is not requested again.

What runs: ``dagster-daemon run`` over the code location (``finetune_assets.definitions``, loaded
by its code server as a deployment loads it) with ``deploy/instance/dagster.yaml`` as it is (run
queue, op-granularity pools, one run per partition, run monitoring, run retries), run and event
storage in a real PostgreSQL server (a fresh database per test), and Dagster's default run launcher
(each run a ``dagster api execute_run`` process; the Kubernetes run launcher is
``test_deployment_backfill.py``'s). Nothing of the flow is played by the test: it lands files,
cancels one run, and reads the instance.

Overrides of the instance file, each because a test must: the storage (the test's database),
``run_monitoring.poll_interval_seconds`` (the test's clock) and the code server's start timeout
(two busy cores). The runs have no run config (automation sets none): the default recipe trains the
tiny BERT on the built-in sample reviews, whose TF-IDF baseline scores macro-F1 1.0, so the default
gate (``baseline_margin: 0``) refuses the model: the refusal path, deterministically. Promotion by
automation's runs is ``test_retrain_e2e.py`` (its runs with a person's run config).

Skipped without a server locally (``. .ci/test_postgres.sh && start_test_postgres``); fails in CI
(``CI=true``) without one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pyarrow.csv as pacsv
import pytest
import yaml

from finetune_assets.core.io.contracts import CHAMPION_MODEL, FINETUNED_MODEL, PRETRAINED_MODEL
from finetune_assets.core.sources.sample import make_sample_reviews
from finetune_assets.defs.versions.run_outcome import STATUS_TAG
from finetune_assets_tests.chart_instance import instance_settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 1300.0
AUTOMATION = "version_automation"
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def _instance_settings(db_url: str) -> dict:
    settings = instance_settings(db_url)
    settings["run_monitoring"].update(poll_interval_seconds=2, free_slots_after_run_end_seconds=5)
    settings["code_servers"] = {"local_startup_timeout": 600}
    return settings


def _land(landing: Path, key: str, n: int, seed: int) -> None:
    drop = landing / key
    drop.mkdir(parents=True)
    pacsv.write_csv(make_sample_reviews(n=n, seed=seed), drop / "reviews.csv")
    (drop / "_SUCCESS").write_text("")


def _runs(instance, version: str) -> list[dg.DagsterRun]:
    return list(instance.get_runs(dg.RunsFilter(tags={"dagster/partition": version})))


def _trains(run: dg.DagsterRun) -> bool:
    return dg.AssetKey(FINETUNED_MODEL) in (run.asset_selection or ())


def _automation_ticks_after(instance, ts: float) -> int:
    """Completed ticks of the automation sensor that began after ``ts``."""
    (sensor,) = [s for s in instance.all_instigator_state() if s.name == AUTOMATION] or [None]
    if sensor is None:
        return 0
    ticks = instance.get_ticks(sensor.instigator_origin_id, sensor.selector_id, limit=50)
    return sum(1 for t in ticks if t.timestamp > ts and t.status.value != "STARTED")


def _step_started(instance, run_id: str) -> bool:
    run = instance.get_run_by_id(run_id)
    if run.is_finished:
        raise AssertionError(f"run {run_id} ended ({run.status}) before a step started")
    return bool(instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START))


def _wait(what: str, ready, began: float, log: Path) -> None:
    while not ready():
        assert time.time() - began < DEADLINE_S, f"{what}; daemon log:\n{log.read_text()[-5000:]}"
        time.sleep(2.0)


def test_a_landed_version_is_built_by_automation_and_ended_runs_are_not_requested_again(
    tmp_path, postgres_url, _tiny_model_session, monkeypatch
):
    from finetune_assets.definitions import build_defs

    home, root, landing = tmp_path / "home", tmp_path / "storage", tmp_path / "landing"
    for d in (home, root, landing):
        d.mkdir()
    env = {
        "DAGSTER_HOME": str(home),
        "FINETUNE_ASSETS_ROOT": str(root),
        "FINETUNE_ASSETS_LANDING": str(landing),
        "DAGSTER_DISABLE_TELEMETRY": "yes",
        "DAGSTER_GRPC_TIMEOUT_SECONDS": "300",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (home / "dagster.yaml").write_text(yaml.safe_dump(_instance_settings(postgres_url)))
    (home / "workspace.yaml").write_text(
        "load_from:\n  - python_module:\n      module_name: finetune_assets.definitions\n"
        f"      working_directory: {REPO}\n"
    )
    instance = dg.DagsterInstance.from_config(str(home))
    log = tmp_path / "daemon.log"
    daemon = None
    try:
        # The install steps deploy/README.md prescribes: the base model, the pools
        base = build_defs(str(root)).resolve_implicit_global_asset_job_def()
        base = base.get_subset(asset_selection={dg.AssetKey(PRETRAINED_MODEL)})
        config = {"ops": {PRETRAINED_MODEL: {"config": {"source": str(_tiny_model_session)}}}}
        assert base.execute_in_process(instance=instance, run_config=config).success
        for pool in ("training", "promotion"):
            instance.event_log_storage.set_concurrency_slots(pool, 1)

        _land(landing, "v1", n=400, seed=1)
        began = time.time()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "dagster._daemon", "run", "-w", str(home / "workspace.yaml")],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=open(log, "w"),  # noqa: SIM115 - the daemon's lifetime
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        # v1: registered, its data run, then its training run; the gate refuses; quiet after
        def v1_decided() -> bool:
            runs = _runs(instance, "v1")
            return any(_trains(r) and r.is_finished for r in runs) and all(
                r.is_finished and (r.status != dg.DagsterRunStatus.FAILURE or STATUS_TAG in r.tags)
                for r in runs
            )

        _wait("v1 was not trained and gated", v1_decided, began, log)
        decided = time.time()
        _wait(
            "the automation sensor stopped ticking",
            lambda: _automation_ticks_after(instance, decided) >= 2,
            began,
            log,
        )
        _check_v1(instance)

        # v2: its first run is cancelled; no run of v2 after it, over two automation ticks
        _land(landing, "v2", n=1200, seed=2)
        _wait("no run of v2", lambda: _runs(instance, "v2"), began, log)
        (first,) = _runs(instance, "v2")
        assert not _trains(first)  # its data first
        # Cancel once a step runs (as Dagster's own launcher tests do, poll_for_step_start): a run
        # still STARTING has no run worker the launcher can reach, and its cancel request is lost
        _wait(
            "the data run of v2 never started a step",
            lambda: _step_started(instance, first.run_id),
            began,
            log,
        )
        assert instance.run_coordinator.cancel_run(first.run_id), "the cancel was refused"
        _wait(
            "the cancelled run did not end",
            lambda: instance.get_run_by_id(first.run_id).is_finished,
            began,
            log,
        )
        ended = time.time()
        _wait(
            "the automation sensor stopped ticking",
            lambda: _automation_ticks_after(instance, ended) >= 2,
            began,
            log,
        )
        assert instance.get_run_by_id(first.run_id).status == dg.DagsterRunStatus.CANCELED
        assert [r.run_id for r in _runs(instance, "v2")] == [first.run_id]
        assert not instance.get_runs(dg.RunsFilter(statuses=IN_FLIGHT))
    except BaseException:
        print(f"daemon log (tail):\n{log.read_text()[-6000:] if log.exists() else ''}")
        raise
    finally:
        if daemon is not None:
            os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait(10)
        instance.dispose()


def _check_v1(instance) -> None:
    runs = sorted(
        _runs(instance, "v1"),
        key=lambda r: instance.get_run_record_by_id(r.run_id).create_timestamp,
    )
    # every run is automation's: the landing sensor requests none
    assert {r.tags.get("dagster/sensor_name") for r in runs} == {AUTOMATION}, [r.tags for r in runs]
    trainings = [r for r in runs if _trains(r)]
    assert len(trainings) == 1, "a refused model was trained again"
    (training,) = trainings
    data = [r for r in runs if not _trains(r)]
    assert data and all(r.status == dg.DagsterRunStatus.SUCCESS for r in data)
    # the training run holds no data step, and started after the data was ready
    names = {k.to_user_string() for k in training.asset_selection}
    assert names == {FINETUNED_MODEL, CHAMPION_MODEL, "benchmark_scores"}
    last_data_end = max(instance.get_run_record_by_id(r.run_id).end_time for r in data)
    created = instance.get_run_record_by_id(training.run_id).create_timestamp  # a datetime
    assert created.timestamp() >= last_data_end  # end_time: seconds since the epoch

    # the gate refused (TF-IDF scores 1.0 on these reviews), the run says so, nothing promoted
    gate = [
        e.dagster_event.event_specific_data
        for e in instance.all_logs(
            training.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        )
        if e.dagster_event.event_specific_data.check_name == "quality_gate"
    ]
    assert len(gate) == 1 and not gate[0].passed, gate
    assert training.status == dg.DagsterRunStatus.FAILURE
    assert training.tags[STATUS_TAG].startswith("trained, but the quality gate refused"), (
        training.tags
    )
    promoted = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(CHAMPION_MODEL), asset_partitions=["v1"]),
        limit=1,
    ).records
    assert not promoted
