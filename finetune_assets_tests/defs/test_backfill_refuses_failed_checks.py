"""Through the daemon: an asset backfill of ``finetuned_model`` over two versions, one whose shards
were corrupted so that its integrity check failed, trains only the healthy one (issue 38).

A blocking check stops the downstream steps of its own run only, and training is a run of its own
(its backfill policy differs from the data assets'): the backfill daemon launches
``finetuned_model[v2]`` whatever ``mds_shards[v2]``'s integrity check said. What stops it is the
product's own refusal (``defs/data/upstream_checks.py``), exercised here end to end: the real
backfill daemon submits both runs, the run queue and pools of ``deploy/instance/dagster.yaml``
launch them (Dagster's default run launcher: each run an ``dagster api execute_run`` process),
and the test only reads the instance afterwards. ``test_checks.py`` has the same refusal in
process.

Set up as a person would have it, cheaply:

- both versions' data (``raw_reviews`` -> ``tokenized_reviews`` -> ``mds_shards`` with their checks,
  on the built-in sample reviews and the tiny BERT) materialized in process beforehand;
- v2's shards then corrupted on disk and ``mds_shards``' integrity checks re-run alone (a run
  without the asset, as "Execute checks" in the UI): ``splits_readable`` fails, recorded;
- automation turned off (``dagster sensor stop version_automation``, the UI's toggle): once the
  backfill trained v1, its conditions would request ``champion_model[v1]`` and
  ``benchmark_scores[v1]``, runs that are not what this test is about and cost minutes on two cores
  (that automation holds back a version whose blocking checks failed is ``test_automation.py``'s);
- the backfill submitted through Dagster's GraphQL API, the mutation the UI sends for
  "Materialize" over chosen partitions (``launchPartitionBackfill`` with ``assetSelection`` and
  ``partitionNames``), by the ``dagster-graphql`` CLI over the same workspace, with run config as
  the launchpad sets it: a two-step training and a gate any model passes (the tiny model is not
  what is judged here; a refused gate would fail v1's run).

Only then ``dagster-daemon run`` starts (its backfill daemon's first tick picks the backfill up).
Run and event storage: PostgreSQL, a fresh database per test, as ``test_automation_daemon.py``
(whose fixture and instance settings this test reuses). Skipped without a server locally
(``. .ci/test_postgres.sh && start_test_postgres``); fails in CI (``CI=true``) without one.
"""

from __future__ import annotations

import json
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
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.storage.tags import BACKFILL_ID_TAG, PARENT_RUN_ID_TAG

from finetune_assets.core.io.contracts import (
    FINETUNED_MODEL,
    MDS_SHARDS,
    PRETRAINED_MODEL,
    RAW_REVIEWS,
    TOKENIZED_REVIEWS,
)
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.sources import SourceSpec
from finetune_assets.core.sources.sample import make_sample_reviews
from finetune_assets_tests.defs import test_automation_daemon as daemon_test

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


REPO = Path(__file__).resolve().parents[2]
VERSIONS = ["v1", "v2"]
BROKEN = "v2"
# Short and cheap: two optimizer steps of the tiny BERT on CPU, one process per run
TRAIN = {
    "epochs": 1,
    "max_steps": 2,
    "batch_size": 8,
    "max_length": 32,
    "num_workers": 0,
    "accelerator": "cpu",
    "precision": "32",
    "log_every_n_steps": 50,
}
GATE = {"baseline_margin": None, "must_beat_majority_baseline": False, "tolerance": 1.0}
RUN_CONFIG = {
    "execution": {"config": {"in_process": {}}},
    "ops": {
        FINETUNED_MODEL: {"config": TRAIN},
        f"{FINETUNED_MODEL}_quality_gate": {"config": GATE},
    },
}
# What the UI's backfill dialog sends (LAUNCH_PARTITION_BACKFILL_MUTATION), errors spelled out
LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on PartitionSetNotFoundError { message }
    ... on UnauthorizedError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
IN_FLIGHT = daemon_test.IN_FLIGHT


def test_an_asset_backfill_trains_only_the_version_whose_checks_passed(
    tmp_path, postgres_url, _tiny_model_session, monkeypatch
):
    from finetune_assets.definitions import build_defs
    from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
    from finetune_assets.defs.versions.register import write_version

    began = time.time()
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
    (home / "dagster.yaml").write_text(yaml.safe_dump(daemon_test._instance_settings(postgres_url)))
    workspace = home / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: finetune_assets.definitions\n"
        f"      working_directory: {REPO}\n"
    )
    instance = dg.DagsterInstance.from_config(str(home))
    log = tmp_path / "daemon.log"
    daemon = None
    try:
        # The install steps deploy/README.md prescribes: the base model, the pools
        defs = build_defs(str(root))
        job = defs.resolve_implicit_global_asset_job_def()
        base = job.get_subset(asset_selection={dg.AssetKey(PRETRAINED_MODEL)})
        config = {"ops": {PRETRAINED_MODEL: {"config": {"source": str(_tiny_model_session)}}}}
        assert base.execute_in_process(instance=instance, run_config=config).success
        for pool in ("training", "promotion"):
            instance.event_log_storage.set_concurrency_slots(pool, 1)

        # Two versions, their data prepared (with its checks, all passing)
        store = Storage(str(root))
        data = job.get_subset(
            asset_selection={dg.AssetKey(k) for k in (RAW_REVIEWS, TOKENIZED_REVIEWS, MDS_SHARDS)}
        )
        for seed, version in enumerate(VERSIONS, start=1):
            drop = tmp_path / "drops" / version
            drop.mkdir(parents=True)
            pacsv.write_csv(make_sample_reviews(n=400, seed=seed), drop / "reviews.csv")
            write_version(store, version, SourceSpec(uri=str(drop)))
            instance.add_dynamic_partitions(DATASET_VERSIONS, [version])
            assert data.execute_in_process(instance=instance, partition_key=version).success
        assert not _failed_checks(instance, VERSIONS)
        prepared = {v: _materialization(instance, MDS_SHARDS, v).run_id for v in VERSIONS}

        # v2's shards corrupted, its integrity checks re-run alone: the failure is recorded
        shards = Path(store.require(MDS_SHARDS, BROKEN).url)
        (shards / "validation" / "index.json").write_text("{not json")
        integrity = job.get_subset(
            asset_selection=frozenset(),
            asset_check_selection=set(
                defs.resolve_asset_graph().get_check_keys_for_assets({dg.AssetKey(MDS_SHARDS)})
            ),
        )
        rechecked = integrity.execute_in_process(
            instance=instance, partition_key=BROKEN, raise_on_error=False
        )
        verdicts = {e.check_name: e.passed for e in rechecked.get_asset_check_evaluations()}
        assert verdicts["splits_readable"] is False, verdicts
        failed = _failed_checks(instance, VERSIONS)
        assert f"{MDS_SHARDS}:splits_readable" in failed[BROKEN] and "v1" not in failed, failed

        # Automation off (the UI's toggle), then the backfill, as the UI submits it
        cli_env = {**os.environ, **env}
        _cli(["dagster", "sensor", "stop", "version_automation", "-w", str(workspace)], cli_env)
        backfill_id = _launch_backfill(workspace, cli_env, tmp_path)
        backfill = instance.get_backfill(backfill_id)
        assert backfill.status == BulkActionStatus.REQUESTED and backfill.is_asset_backfill
        assert backfill.run_config == RUN_CONFIG

        submitted = time.time()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "dagster._daemon", "run", "-w", str(workspace)],
            cwd=REPO,
            env=cli_env,
            stdout=open(log, "w"),  # noqa: SIM115 - the daemon's lifetime
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def done() -> bool:
            if instance.get_runs(dg.RunsFilter(statuses=IN_FLIGHT), limit=1):
                return False
            return instance.get_backfill(backfill_id).status != BulkActionStatus.REQUESTED

        daemon_test._wait("the backfill did not finish", done, began, log)
        finished = time.time()
        _check(instance, root, backfill_id, prepared)
        print(
            "backfill refuses failed checks:",
            json.dumps(
                {
                    "wall_s": round(finished - began, 1),
                    "prepare_s": round(submitted - began, 1),
                    "daemon_s": round(finished - submitted, 1),
                    "backfill_status": instance.get_backfill(backfill_id).status.value,
                }
            ),
        )
    except BaseException:
        print(f"daemon log (tail):\n{log.read_text()[-6000:] if log.exists() else ''}")
        raise
    finally:
        if daemon is not None:
            _stop(daemon)
        instance.dispose()


def _stop(daemon: subprocess.Popen) -> None:
    """The daemon and its code server (one process group)."""
    os.killpg(daemon.pid, signal.SIGTERM)
    try:
        daemon.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(10)


def _cli(args: list[str], env: dict) -> str:
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args[:3]}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _launch_backfill(workspace: Path, env: dict, tmp: Path) -> str:
    """``launchPartitionBackfill`` as the UI's "Materialize" over two partitions sends it."""
    params = {
        "assetSelection": [{"path": [FINETUNED_MODEL]}],
        "partitionNames": VERSIONS,
        "fromFailure": False,
        "tags": [],
        "title": "two versions, one with a failed integrity check",
        "runConfigData": RUN_CONFIG,
    }
    out = tmp / "launch_backfill.json"
    args = ["dagster-graphql", "-w", str(workspace), "-t", LAUNCH_BACKFILL]
    _cli([*args, "-v", json.dumps({"backfillParams": params}), "-o", str(out)], env)
    answer = json.loads(out.read_text())
    result = (answer.get("data") or {}).get("launchPartitionBackfill") or {}
    assert result.get("__typename") == "LaunchBackfillSuccess", answer
    return result["backfillId"]


def _failed_checks(instance, versions: list[str]) -> dict[str, dict[str, str]]:
    """Per version, the blocking input checks whose latest evaluation failed (training refuses)."""
    from finetune_assets.defs.dagster_internals import failed_check_evaluations
    from finetune_assets.defs.data.upstream_checks import BLOCKING_INPUT_CHECKS

    failed = {}
    for version in versions:
        found = failed_check_evaluations(instance, BLOCKING_INPUT_CHECKS, version)
        if found:
            failed[version] = {
                f"{k.asset_key.to_user_string()}:{k.name}": e.description or ""
                for k, e in found.items()
            }
    return failed


def _materialization(instance, asset: str, version: str):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[version]), limit=1
    ).records
    return records[0] if records else None


def _version(run: dg.DagsterRun) -> str | None:
    return run.tags.get("dagster/partition") or run.tags.get("dagster/asset_partition_range_start")


def _check(instance, root: Path, backfill_id: str, prepared: dict[str, str]) -> None:
    # The backfill finished, failed for one of its two partitions
    backfill = instance.get_backfill(backfill_id)
    assert backfill.status == BulkActionStatus.COMPLETED_FAILED, backfill.status

    # One run per version, each training only (the backfill policy: one partition per run), and
    # none re-launched by the run-retry daemon (a refusal is a result, not an accident)
    runs = {
        _version(r): r
        for r in instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
    }
    assert sorted(runs) == VERSIONS, [(r.run_id[:8], v) for v, r in runs.items()]
    for run in runs.values():
        assert set(run.asset_selection or ()) == {dg.AssetKey(FINETUNED_MODEL)}, run.asset_selection
        assert not instance.get_runs(dg.RunsFilter(tags={PARENT_RUN_ID_TAG: run.run_id}))
    every_run = instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
    assert len(every_run) == len(VERSIONS)

    # v1: trained by its backfill run, its gate passed
    healthy = runs["v1"]
    assert healthy.status == dg.DagsterRunStatus.SUCCESS, healthy.status
    model = _materialization(instance, FINETUNED_MODEL, "v1")
    assert model is not None and model.run_id == healthy.run_id
    gates = [
        e.dagster_event.event_specific_data
        for e in instance.all_logs(
            healthy.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        )
    ]
    assert [(g.check_name, g.passed) for g in gates] == [("quality_gate", True)], gates

    # v2: its run failed at finetuned_model with the refusal naming the failed check; nothing
    # trained, nothing launched (no checkpoints), its shards left as they were (not re-made)
    broken = runs[BROKEN]
    assert broken.status == dg.DagsterRunStatus.FAILURE, broken.status
    failures = [
        e.dagster_event
        for e in instance.all_logs(broken.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    ]
    assert [f.step_key for f in failures] == [FINETUNED_MODEL], failures
    why = failures[0].step_failure_data.user_failure_data
    assert why is not None, failures[0].step_failure_data.error
    assert f"{FINETUNED_MODEL}[{BROKEN}] refused" in why.description, why.description
    assert f"{MDS_SHARDS}:splits_readable" in why.description, why.description
    assert _materialization(instance, FINETUNED_MODEL, BROKEN) is None
    assert not (root / FINETUNED_MODEL / BROKEN / "checkpoints").exists()
    assert not instance.all_logs(
        broken.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ), "the gate ran on a model that was never trained"
    for version in VERSIONS:
        assert _materialization(instance, MDS_SHARDS, version).run_id == prepared[version]
