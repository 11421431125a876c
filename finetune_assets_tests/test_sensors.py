"""The new-data sensor against a real instance: versions of the Arabic reviews landing over
several ticks.
"""

import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from finetune_assets.contracts import CHAMPION_MODEL as CHAMPION
from finetune_assets.contracts import FINETUNED_MODEL as FINETUNED
from finetune_assets.contracts import PRETRAINED_MODEL as PRETRAINED
from finetune_assets.data.sources import SourceSpec, read_source
from finetune_assets.dataset_versions.partitions import DATASET_VERSIONS
from finetune_assets.dataset_versions.registry import read_version
from finetune_assets.jobs import DATA_PREPARATION
from finetune_assets.resources.landing import LandingZoneResource, fingerprint
from finetune_assets.resources.storage_root import StorageResource
from finetune_assets.sensors import LandingCursor, landing_zone_sensor
from finetune_assets.storage import Storage

PREPARE = tuple(a.key.to_user_string() for a in DATA_PREPARATION)  # names, in flow order
VERSION_CHAIN = (*PREPARE, FINETUNED, CHAMPION)


class Daemon:
    """What the sensor daemon does with a tick's result: apply partition requests, keep the
    cursor, dedupe run keys.
    """

    def __init__(self, instance, landing: Path, storage_root: Path):
        self.instance = instance
        self.resources = {
            "landing": LandingZoneResource(url=str(landing)),
            "storage": StorageResource(root=str(storage_root)),
        }
        self.cursor: str | None = None
        self.run_keys: set[str] = set()

    def tick(self) -> tuple[list[str], list[dg.RunRequest], str | None]:
        ctx = dg.build_sensor_context(
            instance=self.instance, cursor=self.cursor, resources=self.resources
        )
        result = landing_zone_sensor(ctx)
        assert isinstance(result, dg.SensorResult)
        added = []
        for req in result.dynamic_partitions_requests or []:
            assert isinstance(req, dg.AddDynamicPartitionsRequest)
            # A partition is never requested twice: the sensor checks the instance first.
            assert not set(req.partition_keys) & set(
                self.instance.get_dynamic_partitions(DATASET_VERSIONS)
            )
            self.instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
            added += list(req.partition_keys)
        self.cursor = result.cursor
        fresh = [r for r in result.run_requests or [] if r.run_key not in self.run_keys]
        self.run_keys |= {r.run_key for r in result.run_requests or []}
        skip = result.skip_reason.skip_message if result.skip_reason else None
        return added, fresh, skip


def _publish_base(storage_root: Path) -> None:
    with Storage(str(storage_root)).publish(PRETRAINED) as staging:
        (staging.local_dir / "config.json").write_text("{}")
        staging.data_version = "base-1"


def _folder(landing: Path, name: str, files: list[Path], success: bool = True) -> Path:
    d = landing / name
    d.mkdir(parents=True)
    for f in files:
        shutil.copy(f, d / f.name)
    if success:
        (d / "_SUCCESS").write_text("")
    return d


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    d = tmp_path / "landing"
    d.mkdir()
    return d


@pytest.fixture
def daemon(instance, landing, storage_root) -> Daemon:
    _publish_base(storage_root)
    return Daemon(instance, landing, storage_root)


def test_three_versions_over_several_ticks(daemon, landing, storage_root, arabic_reviews, tmp_path):
    prod, att, res2 = (arabic_reviews / f for f in ("PROD.csv", "ATT.csv", "RES2.csv"))

    v1 = _folder(landing, "v1", [prod], success=False)  # still copying
    added, runs, skip = daemon.tick()
    assert (added, runs) == ([], [])
    assert "v1: waiting for _SUCCESS" in skip

    (v1 / "_SUCCESS").write_text("")
    _folder(landing, "bad key", [prod])  # malformed: a space in the key
    (landing / "notes.txt").write_text("not a dataset")  # unsupported file type
    added, runs, _ = daemon.tick()
    assert added == ["v1"] and [r.partition_key for r in runs] == ["v1"]
    all_runs = list(runs)

    _folder(landing, "v2", [prod, att])
    # v3 = PROD + ATT + RES2 as one Parquet file, dropped as a plain file (no marker: it must settle
    # first)
    table = pa.concat_tables(
        [read_source(SourceSpec(uri=str(f))).select(["text", "label"]) for f in (prod, att, res2)]
    )
    pq.write_table(table, landing / "v3.parquet")
    added, runs, skip = daemon.tick()
    assert added == ["v2"] and [r.partition_key for r in runs] == ["v2"]
    all_runs += runs
    added, runs, skip = daemon.tick()  # v3 unchanged since the last tick: complete
    assert added == ["v3"] and [r.partition_key for r in runs] == ["v3"]
    all_runs += runs

    for _ in range(3):  # repeated ticks: nothing new, the malformed drops are still named
        added, runs, skip = daemon.tick()
        assert (added, runs) == ([], [])
        assert "bad key: invalid dataset version key" in skip
        assert "notes.txt: unsupported file type" in skip

    assert sorted(daemon.instance.get_dynamic_partitions(DATASET_VERSIONS)) == ["v1", "v2", "v3"]
    assert len(daemon.run_keys) == 3
    store = Storage(str(storage_root))
    for key, uri in (("v1", v1), ("v2", landing / "v2"), ("v3", landing / "v3.parquet")):
        record = read_version(store, key)
        assert record is not None and record.source.uri == str(uri)
        assert record.fingerprint == fingerprint(str(uri))
        assert f"{key}:{record.fingerprint}" in daemon.run_keys  # run key carries the content hash
    # every version's first run prepares its data (the base model is already built: not re-run)
    assert all(r.asset_selection == [dg.AssetKey(a) for a in PREPARE] for r in all_runs)


def test_runs_select_the_version_chain_and_daemon_restart_duplicates_nothing(
    daemon, landing, arabic_reviews
):
    _folder(landing, "v1", [arabic_reviews / "PROD.csv"])
    _folder(landing, "v2", [arabic_reviews / "PROD.csv", arabic_reviews / "ATT.csv"])
    added, runs, _ = daemon.tick()  # two versions at once
    assert sorted(added) == ["v1", "v2"] and sorted(r.partition_key for r in runs) == ["v1", "v2"]
    assert all(r.asset_selection == [dg.AssetKey(a) for a in PREPARE] for r in runs)
    assert all(r.tags["finetune_assets/dataset_version"] == r.partition_key for r in runs)
    assert {r.job_name for r in runs} == {"retrain_job"}  # tuning is off unless a deployment asks

    daemon.cursor = None  # restarted daemon that lost its cursor (or a sensor reset)
    added, runs, _ = daemon.tick()
    # partitions exist; re-requested runs carry run keys already seen
    assert added == [] and runs == []
    added, runs, _ = daemon.tick()
    assert (added, runs) == ([], [])


def test_incomplete_and_malformed_drops_produce_nothing_but_a_reason(
    daemon, landing, arabic_reviews
):
    _folder(landing, "v1", [arabic_reviews / "PROD.csv"], success=False)
    _folder(landing, "empty", [])  # marker but no data files
    _folder(landing, "-lead", [arabic_reviews / "PROD.csv"])
    (landing / "v9.csv").write_bytes(b"")  # a file appears...
    (landing / "_tmp.csv").write_text("ignored")  # in-progress uploads are ignored silently
    (landing / "dup").mkdir()
    (landing / "dup.csv").write_text("text,label\nok,1\n")
    added, runs, skip = daemon.tick()
    assert (added, runs) == ([], [])
    assert "v1: waiting for _SUCCESS" in skip
    assert "empty:" in skip and "holds no" in skip
    assert "-lead: invalid dataset version key" in skip
    assert "v9.csv: waiting one tick" in skip
    assert "ambiguous" in skip and "_tmp" not in skip
    # ...and keeps changing: not complete yet
    (landing / "v9.csv").write_text("text,label\ngood,1\n")
    added, runs, skip = daemon.tick()
    assert (added, runs) == ([], []) and "v9.csv: waiting one tick" in skip
    assert daemon.instance.get_dynamic_partitions(DATASET_VERSIONS) == []


def test_a_malformed_drop_does_not_block_others(daemon, landing, arabic_reviews):
    _folder(landing, "a b", [arabic_reviews / "PROD.csv"])
    _folder(landing, "empty", [])
    _folder(landing, "v1", [arabic_reviews / "PROD.csv"])
    added, runs, _ = daemon.tick()
    assert added == ["v1"] and [r.partition_key for r in runs] == ["v1"]


def test_changed_content_under_a_registered_key_is_refused(daemon, landing, arabic_reviews):
    v1 = _folder(landing, "v1", [arabic_reviews / "PROD.csv"])
    assert daemon.tick()[0] == ["v1"]
    shutil.copy(arabic_reviews / "ATT.csv", v1 / "ATT.csv")
    added, runs, skip = daemon.tick()
    assert (added, runs) == ([], [])
    assert "content changed after version v1 was registered" in skip


def test_deleted_version_relanded_with_new_content_runs_again(daemon, landing, arabic_reviews):
    v1 = _folder(landing, "v1", [arabic_reviews / "PROD.csv"])
    _, first, _ = daemon.tick()
    # The user deletes the partition and the drop, resets the sensor, and lands different data as
    # v1.
    daemon.instance.delete_dynamic_partition(DATASET_VERSIONS, "v1")
    shutil.rmtree(v1)
    daemon.cursor = None
    _folder(landing, "v1", [arabic_reviews / "RES2.csv"])
    added, runs, _ = daemon.tick()
    assert added == ["v1"] and len(runs) == 1 and runs[0].run_key != first[0].run_key


def test_missing_base_model_is_built_by_one_run_only(
    instance, landing, storage_root, arabic_reviews
):
    daemon = Daemon(instance, landing, storage_root)  # no pretrained_model published
    _folder(landing, "v1", [arabic_reviews / "PROD.csv"])
    _folder(landing, "v2", [arabic_reviews / "ATT.csv"])
    added, runs, _ = daemon.tick()
    assert sorted(added) == ["v1", "v2"]
    assert len(runs) == 1 and dg.AssetKey(PRETRAINED) in runs[0].asset_selection
    added, runs, skip = daemon.tick()  # base still building: v2 waits, nothing duplicated
    assert (added, runs) == (
        [],
        [],
    ) and "v2: registered; its run waits until pretrained_model" in skip
    assert LandingCursor.parse(daemon.cursor).awaiting_base.keys() == {"v2"}
    _publish_base(storage_root)
    added, runs, _ = daemon.tick()
    assert added == [] and [r.partition_key for r in runs] == ["v2"]
    assert dg.AssetKey(PRETRAINED) not in runs[0].asset_selection
    assert daemon.tick()[:2] == ([], [])


def test_landing_folder_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FINETUNE_ASSETS_LANDING", str(tmp_path / "drop"))
    zone = LandingZoneResource()
    assert zone.location() == str(tmp_path / "drop")
    assert zone.list_entries() == [] and (tmp_path / "drop").is_dir()  # created for a new user


def test_jobs_select_the_expected_assets(storage_root):
    from finetune_assets.definitions import build_defs

    repo = build_defs(str(storage_root)).get_repository_def()
    assets = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    if FINETUNED not in assets:
        pytest.fail("finetuned_model is not in definitions.py yet (retrain_job would not train)")
    selected = {
        j: {k.to_user_string() for k in repo.get_job(j).asset_layer.executable_asset_keys}
        for j in ("retrain_job", "finetune_only_job", "base_model_job", "tune_job")
    }
    chain = set(VERSION_CHAIN) - {FINETUNED, CHAMPION}
    assert selected == {
        "retrain_job": {*VERSION_CHAIN, PRETRAINED},
        "finetune_only_job": {FINETUNED, CHAMPION},
        "base_model_job": {PRETRAINED},
        "tune_job": {*chain, "tuning_study", PRETRAINED},
    }
    sensor = repo.get_sensor_def("landing_zone_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert {"landing", "storage"} <= set(repo.get_top_level_resources())


# -- bounded ticks, isolated errors, failed runs ---------------------------------------------


def _memory_landing(name: str, n: int) -> str:
    """``n`` complete version folders on fsspec's in-memory filesystem (an object store stand-in: no
    folder mtimes, listings only).
    """
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/{name}"
    for i in range(n):
        fs.pipe(f"{root}/v{i:04d}/reviews.csv", b"text,label\ngood,1\n")
        fs.pipe(f"{root}/v{i:04d}/_SUCCESS", b"")
    return f"memory://{root}"


def test_a_tick_over_500_folders_with_a_slow_fingerprint_stays_in_budget_and_saves_progress(
    instance, storage_root, tmp_path, monkeypatch
):
    import finetune_assets.sensors as sensors

    _publish_base(storage_root)
    landing = _memory_landing(f"landing-{tmp_path.name}", 500)
    clock = [0.0]
    fingerprinted: list[str] = []

    def slow_fingerprint(uri):  # each drop costs 0.5 s of (simulated) reading
        clock[0] += 0.5
        fingerprinted.append(uri)
        return fingerprint(uri)

    monkeypatch.setattr(sensors, "fingerprint", slow_fingerprint)
    resources = {
        "landing": LandingZoneResource(url=landing, tick_budget_s=10.0),
        "storage": StorageResource(root=str(storage_root)),
    }
    cursor, ticks, registered = None, 0, 0
    while registered < 500:
        ticks += 1
        assert ticks <= 30, "the sensor stopped making progress"
        start = clock[0]
        ctx = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
        result = sensors.evaluate_landing(
            ctx, resources["landing"], resources["storage"], clock=lambda: clock[0]
        )
        # the budget, plus the one drop in progress when it ran out
        assert clock[0] - start <= 10.0 + 0.5
        for req in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
            registered += len(req.partition_keys)
        cursor = result.cursor  # progress of this tick survives
        assert len(LandingCursor.parse(cursor).registered) == registered
    assert ticks > 1 and len(fingerprinted) == 500 == len(set(fingerprinted))  # each drop read once
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    before = len(fingerprinted)
    sensors.evaluate_landing(
        ctx, resources["landing"], resources["storage"], clock=lambda: clock[0]
    )
    assert len(fingerprinted) == before  # registered folders cost nothing beyond the listing


def test_an_unreadable_drop_does_not_block_the_others(daemon, landing, arabic_reviews, monkeypatch):
    import finetune_assets.sensors as sensors

    for name in ("v1", "v2", "v3"):
        _folder(landing, name, [arabic_reviews / "ATT.csv"])

    def flaky(uri):
        if uri.endswith("v2"):
            raise PermissionError(13, "Permission denied", uri)
        return fingerprint(uri)

    monkeypatch.setattr(sensors, "fingerprint", flaky)
    added, runs, _ = daemon.tick()
    assert added == ["v1", "v3"] and sorted(r.partition_key for r in runs) == ["v1", "v3"]
    # readable again: registered on the next tick
    monkeypatch.setattr(sensors, "fingerprint", fingerprint)
    added, runs, _ = daemon.tick()
    assert added == ["v2"] and [r.partition_key for r in runs] == ["v2"]


def _finish(instance, request: dg.RunRequest, status, job_name: str = "retrain_job") -> str:
    """What the daemon + run worker leave behind for a request: a run with its run key and an
    outcome.
    """
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._core.utils import make_new_run_id

    run = DagsterRun(
        job_name=job_name,
        run_id=make_new_run_id(),
        tags={
            **request.tags,
            "dagster/run_key": request.run_key,
            "dagster/partition": request.partition_key,
        },
        status=status,
    )
    instance.add_run(run)
    return run.run_id


def test_a_cancelled_run_is_never_requested_again(daemon, landing, arabic_reviews):
    from finetune_assets.sensors import STATUS_TAG

    _folder(landing, "v1", [arabic_reviews / "ATT.csv"])
    _, (request,), _ = daemon.tick()
    # an operator's decision
    cancelled = _finish(daemon.instance, request, dg.DagsterRunStatus.CANCELED)
    _, runs, skip = daemon.tick()
    assert runs == [] and "was cancelled; not re-requested" in skip
    assert daemon.instance.get_run_by_id(cancelled).tags[STATUS_TAG].startswith("failed: run")
    assert daemon.tick()[1] == []


def _run_that_fails_at(instance, request: dg.RunRequest, failing: str) -> str:
    """A real run (events and all) under the request's run key: ``finetuned_model`` materializes,
    then ``failing`` raises what an MLflow outage raises.
    """
    from finetune_assets.dataset_versions.partitions import dataset_versions

    @dg.asset(name="finetuned_model", partitions_def=dataset_versions)
    def trained() -> None:
        return None

    @dg.asset(name="champion_model", partitions_def=dataset_versions, deps=[trained])
    def promote() -> None:
        if failing == "champion_model":
            raise ConnectionError("MLflow registry: 503 Service Unavailable")

    result = dg.materialize(
        [trained, promote],
        instance=instance,
        partition_key=request.partition_key,
        tags={**request.tags, "dagster/run_key": request.run_key},
        raise_on_error=False,
    )
    return result.run_id


def test_a_failed_run_is_reported_as_what_failed_and_not_requested_again(
    daemon, landing, arabic_reviews
):
    """Dagster's run retries are the one retry layer (the run here will not be retried): the sensor
    reports the failed step, and a failure after training is not called a quality-gate refusal.
    """
    _folder(landing, "v1", [arabic_reviews / "ATT.csv"])
    _, (prepare,), _ = daemon.tick()
    _finish(daemon.instance, prepare, dg.DagsterRunStatus.SUCCESS)
    _, (train,), _ = daemon.tick()
    run_id = _run_that_fails_at(daemon.instance, train, "champion_model")
    _, runs, skip = daemon.tick()
    assert runs == []
    why = LandingCursor.parse(daemon.cursor).failed["v1"]
    assert why.startswith(f"run {run_id[:8]} failed at champion_model (") and "503" in why, why
    assert "quality gate" not in why and why in skip


def test_data_preparation_then_training_each_run_once(daemon, landing, arabic_reviews):
    """Training is a run of its own, requested when the version's data-preparation run succeeded:
    the run queue, not an idle run pod, waits for the training slot. Neither run is requested twice.
    """
    _folder(landing, "v1", [arabic_reviews / "ATT.csv"])
    _, (prepare,), _ = daemon.tick()
    assert prepare.asset_selection == [dg.AssetKey(a) for a in PREPARE]
    assert daemon.tick()[1] == []  # still running: nothing more
    _finish(daemon.instance, prepare, dg.DagsterRunStatus.SUCCESS)
    _, (train,), _ = daemon.tick()
    assert train.asset_selection == [dg.AssetKey(FINETUNED), dg.AssetKey(CHAMPION)]
    assert train.partition_key == "v1" and train.run_key == f"{prepare.run_key}:train"
    assert train.tags["finetune_assets/phase"] == "train"
    _finish(daemon.instance, train, dg.DagsterRunStatus.SUCCESS)
    assert daemon.tick()[1] == [] and LandingCursor.parse(daemon.cursor).runs == {}
    daemon.cursor = None  # a lost cursor re-requests both by run key: the daemon drops them
    assert daemon.tick()[1] == [] and daemon.tick()[1] == []


def test_a_base_model_run_that_never_appeared_is_requested_again(
    instance, landing, storage_root, arabic_reviews
):
    """A version waiting for the base model never waits forever: its builder's run is followed
    too.
    """
    import json

    from finetune_assets.sensors import LOST_AFTER_S

    daemon = Daemon(instance, landing, storage_root)  # no pretrained_model published
    _folder(landing, "v1", [arabic_reviews / "ATT.csv"])
    _folder(landing, "v2", [arabic_reviews / "PROD.csv"])
    _, (first,), _ = daemon.tick()
    assert dg.AssetKey(PRETRAINED) in first.asset_selection
    # the request was dropped: no run appears for longer than the grace period
    data = json.loads(daemon.cursor)
    data["runs"][first.partition_key]["at"] -= LOST_AFTER_S + 1
    daemon.cursor = json.dumps(data)
    _, (again,), _ = daemon.tick()
    assert again.partition_key == first.partition_key and again.run_key == f"{first.run_key}:2"
    assert dg.AssetKey(PRETRAINED) in again.asset_selection


def test_fingerprint_covers_exactly_the_files_the_reader_reads(tmp_path):
    """The sensor's fingerprint and the source reader share one ignore rule: an edit to a file the
    reader reads (``_2024.csv``) is a new fingerprint; an edit to one it ignores (hidden, README) is
    not.
    """
    drop = tmp_path / "v1"
    drop.mkdir()
    (drop / "a.csv").write_text("text,label\ngood,Positive\n")
    (drop / "_2024_reviews.csv").write_text("text,label\nbad,Negative\n")
    (drop / ".ipynb_checkpoints").mkdir()
    (drop / ".ipynb_checkpoints" / "a-checkpoint.csv").write_text("text,label\nold,Positive\n")
    (drop / "README.md").write_text("about\n")
    first = fingerprint(str(drop))

    (drop / ".ipynb_checkpoints" / "a-checkpoint.csv").write_text(
        "text,label\nolder one,Positive\n"
    )
    (drop / "README.md").write_text("about these reviews\n")
    assert fingerprint(str(drop)) == first

    (drop / "_2024_reviews.csv").write_text("text,label\nbad,Negative\nworse,Negative\n")
    assert fingerprint(str(drop)) != first


def test_a_refused_blocking_data_check_is_reported_as_such(daemon, landing, arabic_reviews):
    from finetune_assets.dataset_versions.partitions import dataset_versions

    _folder(landing, "v1", [arabic_reviews / "ATT.csv"])
    _, (request,), _ = daemon.tick()

    @dg.asset(
        name="raw_reviews",
        partitions_def=dataset_versions,
        check_specs=[dg.AssetCheckSpec("min_rows_per_class", asset="raw_reviews", blocking=True)],
    )
    def raw():
        yield dg.Output(None)
        yield dg.AssetCheckResult(
            check_name="min_rows_per_class",
            passed=False,
            description="Mixed: 12 reviews, needs 50",
            metadata={"fix": "add Mixed reviews"},
        )

    dg.materialize(
        [raw],
        instance=daemon.instance,
        partition_key="v1",
        raise_on_error=False,
        tags={**request.tags, "dagster/run_key": request.run_key},
    )
    daemon.tick()
    why = LandingCursor.parse(daemon.cursor).failed["v1"]
    assert (
        "blocking check min_rows_per_class (Mixed: 12 reviews, needs 50; fix: add Mixed reviews) "
        "refused the data" in why
    )


def test_a_deployment_that_tunes_new_versions_tunes_then_trains_the_winner(
    daemon, landing, arabic_reviews
):
    """``tune_new_versions``: the version's run is tune_job (study, no model); its success makes
    ``tuned_retrain_sensor`` request finetune_only_job with the study's winner, once per run.
    """
    from finetune_assets.definitions import defs
    from finetune_assets.tuning.on_landing import tuned_retrain_sensor

    daemon.resources["landing"] = LandingZoneResource(url=str(landing), tune_new_versions=True)
    _folder(landing, "v1", [arabic_reviews / "ATT.csv"])
    _, (prepare,), _ = daemon.tick()  # data preparation as always
    assert prepare.job_name == "retrain_job"
    assert prepare.asset_selection == [dg.AssetKey(a) for a in PREPARE]
    _finish(daemon.instance, prepare, dg.DagsterRunStatus.SUCCESS)
    _, (request,), _ = daemon.tick()  # the training run is the study
    assert request.job_name == "tune_job" and request.partition_key == "v1"
    assert request.asset_selection == [dg.AssetKey("tuning_study")]
    assert request.run_key == f"{prepare.run_key}:train"  # followed as the training run

    run_id = _finish(daemon.instance, request, dg.DagsterRunStatus.SUCCESS, job_name="tune_job")
    from dagster._core.events import StepMaterializationData

    study = dg.AssetMaterialization(
        "tuning_study", partition="v1", metadata={"study_complete": True}
    )
    daemon.instance.report_dagster_event(  # the study the run published (else: default recipe)
        dg.DagsterEvent(
            event_type_value="ASSET_MATERIALIZATION",
            job_name="tune_job",
            event_specific_data=StepMaterializationData(study),
        ),
        run_id=run_id,
    )
    assert daemon.tick()[1] == [] and LandingCursor.parse(daemon.cursor).runs == {}
    run = daemon.instance.get_run_by_id(run_id)
    success = dg.DagsterEvent(event_type_value="PIPELINE_SUCCESS", job_name="tune_job")
    ctx = dg.build_run_status_sensor_context(
        sensor_name="tuned_retrain_sensor",
        dagster_event=success,
        dagster_instance=daemon.instance,
        dagster_run=run,
    )
    final = tuned_retrain_sensor(ctx)
    assert isinstance(final, dg.RunRequest) and final.partition_key == "v1"
    assert final.run_key == f"{run_id}:winner"
    job = defs.resolve_job_def("finetune_only_job")
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {
        FINETUNED,
        CHAMPION,
    }
    config = final.run_config["ops"][FINETUNED]["config"]
    assert config == {"hyper_parameters_from": "study"}
    assert dg.validate_run_config(job, final.run_config)  # the launchpad would accept it

    # A tune_job run a person launched only tunes: the sensor leaves the model to them.
    by_hand = _finish(
        daemon.instance,
        dg.RunRequest(run_key="by-hand", partition_key="v1"),
        dg.DagsterRunStatus.SUCCESS,
    )
    ctx = dg.build_run_status_sensor_context(
        sensor_name="tuned_retrain_sensor",
        dagster_event=success,
        dagster_instance=daemon.instance,
        dagster_run=daemon.instance.get_run_by_id(by_hand),
    )
    assert isinstance(tuned_retrain_sensor(ctx), dg.SkipReason)
