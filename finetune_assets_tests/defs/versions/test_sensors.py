"""The new-data sensor against a real instance: versions of the Arabic reviews landing over
several ticks. The sensor only registers (a version record, then its partition); it requests no run
(automation builds each version: test_automation.py).
"""

import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from finetune_assets.core.io.contracts import CHAMPION_MODEL as CHAMPION
from finetune_assets.core.io.contracts import FINETUNED_MODEL as FINETUNED
from finetune_assets.core.io.contracts import PRETRAINED_MODEL as PRETRAINED
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets.defs.jobs import DATA_PREPARATION
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.landing import LandingZoneResource, fingerprint
from finetune_assets.defs.versions.landing_sensor import LandingCursor, landing_zone_sensor
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets.defs.versions.register import read_version

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
        assert not result.run_requests, "the landing sensor requests no runs: automation does"
        fresh: list[dg.RunRequest] = []
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
    assert added == ["v1"]

    _folder(landing, "v2", [prod, att])
    # v3 = PROD + ATT + RES2 as one Parquet file, dropped as a plain file (no marker: it must settle
    # first)
    table = pa.concat_tables(
        [read_source(SourceSpec(uri=str(f))).select(["text", "label"]) for f in (prod, att, res2)]
    )
    pq.write_table(table, landing / "v3.parquet")
    added, runs, skip = daemon.tick()
    assert added == ["v2"]
    added, runs, skip = daemon.tick()  # v3 unchanged since the last tick: complete
    assert added == ["v3"]

    for _ in range(3):  # repeated ticks: nothing new, the malformed drops are still named
        added, runs, skip = daemon.tick()
        assert (added, runs) == ([], [])
        assert "bad key: invalid dataset version key" in skip
        assert "notes.txt: unsupported file type" in skip

    assert sorted(daemon.instance.get_dynamic_partitions(DATASET_VERSIONS)) == ["v1", "v2", "v3"]
    store = Storage(str(storage_root))
    for key, uri in (("v1", v1), ("v2", landing / "v2"), ("v3", landing / "v3.parquet")):
        record = read_version(store, key)
        assert record is not None and record.source.uri == str(uri)
        assert record.fingerprint == fingerprint(str(uri))


def test_daemon_restart_duplicates_nothing(daemon, landing, arabic_reviews):
    _folder(landing, "v1", [arabic_reviews / "PROD.csv"])
    _folder(landing, "v2", [arabic_reviews / "PROD.csv", arabic_reviews / "ATT.csv"])
    added, runs, _ = daemon.tick()  # two versions at once
    assert sorted(added) == ["v1", "v2"]

    daemon.cursor = None  # restarted daemon that lost its cursor (or a sensor reset)
    added, runs, _ = daemon.tick()
    assert added == [] and runs == []  # the partitions exist: nothing registered twice
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
    assert added == ["v1"]


def test_changed_content_under_a_registered_key_is_refused(daemon, landing, arabic_reviews):
    v1 = _folder(landing, "v1", [arabic_reviews / "PROD.csv"])
    assert daemon.tick()[0] == ["v1"]
    shutil.copy(arabic_reviews / "ATT.csv", v1 / "ATT.csv")
    added, runs, skip = daemon.tick()
    assert (added, runs) == ([], [])
    assert "content changed after version v1 was registered" in skip


def test_deleted_version_relanded_with_new_content_registers_again(
    daemon, landing, arabic_reviews, storage_root
):
    from finetune_assets.defs.versions.register import record_url

    v1 = _folder(landing, "v1", [arabic_reviews / "PROD.csv"])
    daemon.tick()
    store = Storage(str(storage_root))
    first = read_version(store, "v1").fingerprint
    # The user deletes the partition and the drop, resets the sensor, and lands different data as
    # v1.
    daemon.instance.delete_dynamic_partition(DATASET_VERSIONS, "v1")
    shutil.rmtree(v1)
    store.fs.rm(record_url(store, "v1"))  # what deleting the version removes
    daemon.cursor = None
    _folder(landing, "v1", [arabic_reviews / "RES2.csv"])
    added, runs, _ = daemon.tick()
    assert added == ["v1"] and read_version(store, "v1").fingerprint != first


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
    import finetune_assets.defs.versions.landing_sensor as sensors

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
    import finetune_assets.defs.versions.landing_sensor as sensors

    for name in ("v1", "v2", "v3"):
        _folder(landing, name, [arabic_reviews / "ATT.csv"])

    def flaky(uri):
        if uri.endswith("v2"):
            raise PermissionError(13, "Permission denied", uri)
        return fingerprint(uri)

    monkeypatch.setattr(sensors, "fingerprint", flaky)
    added, runs, _ = daemon.tick()
    assert added == ["v1", "v3"]
    # readable again: registered on the next tick
    monkeypatch.setattr(sensors, "fingerprint", fingerprint)
    added, runs, _ = daemon.tick()
    assert added == ["v2"]


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


def _finish(instance, tags: dict[str, str], status) -> str:
    """A finished run as the run worker leaves it."""
    from dagster._core.storage.dagster_run import DagsterRun
    from dagster._core.utils import make_new_run_id

    run = DagsterRun(job_name="__ASSET_JOB", run_id=make_new_run_id(), tags=tags, status=status)
    instance.add_run(run)
    return run.run_id


def test_a_deployment_that_tunes_new_versions_tunes_then_trains_the_winner(instance, storage_root):
    """``definitions_tuning``: the study of a version, requested by ``tuning_automation`` (its
    runs tagged as such), makes ``tuned_retrain_sensor`` request finetune_only_job with the
    study's winner, once per run.
    """
    from finetune_assets.core.tuning.tags import FALLBACK_TAG
    from finetune_assets.definitions import build_defs
    from finetune_assets.defs.tuning.on_landing import WINNER_CONFIG, tuned_retrain_sensor

    defs = build_defs(str(storage_root), tune_new_versions=True)
    automation = defs.get_sensor_def("tuning_automation")
    run_id = _finish(
        instance,
        {**automation.run_tags, "dagster/partition": "v1"},
        dg.DagsterRunStatus.SUCCESS,
    )
    run = instance.get_run_by_id(run_id)
    success = dg.DagsterEvent(event_type_value="PIPELINE_SUCCESS", job_name=run.job_name)
    ctx = dg.build_run_status_sensor_context(
        sensor_name="tuned_retrain_sensor",
        dagster_event=success,
        dagster_instance=instance,
        dagster_run=run,
    )
    final = tuned_retrain_sensor(ctx)
    # this run published no study: the default recipe (a published one: training/test_tuning.py)
    assert isinstance(final, dg.RunRequest) and final.partition_key == "v1"
    assert final.run_key == f"{run_id}:fallback"
    assert "found no completed trial" in final.tags[FALLBACK_TAG]
    job = defs.resolve_job_def("finetune_only_job")
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {
        FINETUNED,
        CHAMPION,
    }
    assert WINNER_CONFIG["ops"][FINETUNED]["config"] == {"hyper_parameters_from": "study"}
    assert dg.validate_run_config(job, WINNER_CONFIG)  # the launchpad would accept it

    # A tune_job run a person launched only tunes: the sensor leaves the model to them.
    by_hand = _finish(instance, {"dagster/partition": "v1"}, dg.DagsterRunStatus.SUCCESS)
    ctx = dg.build_run_status_sensor_context(
        sensor_name="tuned_retrain_sensor",
        dagster_event=success,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(by_hand),
    )
    assert isinstance(tuned_retrain_sensor(ctx), dg.SkipReason)
