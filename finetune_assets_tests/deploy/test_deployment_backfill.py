"""The deployment end to end: a 3-version asset backfill on the Helm chart's kind of instance, and a
run worker SIGKILLed mid-training.

What runs is what the chart deploys, as far as one machine allows:

- the instance: ``deploy/instance/dagster.yaml`` as it is (run queue, op-granularity pools, one run
  per partition, run monitoring, run retries), with run, event-log and schedule storage in a real
  PostgreSQL server, a fresh database per test (``FINETUNE_TEST_POSTGRES_URL`` names the server;
  ``.ci/run`` starts Debian's, ``.ci/test_postgres.sh``), as the chart's database;
- ``dagster-daemon run`` over the code location (its code server, the run queue, the backfill, run
  monitoring and run retry daemons);
- the run launcher: the real ``dagster_k8s.K8sRunLauncher`` with a kubeconfig for the local
  control plane (``.ci/k8s/control-plane``: upstream kube-apiserver, etcd, controller manager,
  scheduler; docs/k8s-control-plane.md), in a namespace set up as deploy/ says (Pod Security
  ``baseline`` enforced, the ``finetune-launcher`` ServiceAccount, the instance ConfigMap): every
  run is a run-worker Job that the real Job controller turns into a pod, the real scheduler binds
  to a node, and a node agent runs as a local process (``dagster api execute_run``, PID 1 of its
  own PID namespace where the host allows) with its service-account token mounted, opening the
  same PostgreSQL storage, as run pods do;
- three dataset versions of real reviews (100 per class), the tiny BERT as base model, and one asset
  backfill of the version chain over the three partitions, submitted as "Materialize" over
  partitions in the UI does.

The first training run seen with a checkpoint written gets its pod's processes SIGKILLed (an OOM
kill, as the kernel does it): the node agent reports the pod Failed (137), the real Job controller
fails the Job (``backoffLimit: 0``), ``check_run_worker_health`` says so,
run monitoring fails the run, the run-retry daemon re-launches it from the failed step, and the
retry's training resumes from the checkpoint and finishes the version.

Overrides of the instance file, each because a test must:

- ``storage``: PostgreSQL at the test's own database (the chart renders its database the same way);
- ``run_launcher``: the chart's ``K8sRunLauncher``, pointed at the plane (kubeconfig, namespace,
  image name; ``env_vars`` the run pods need, which the chart passes through the deployment's env);
- ``run_monitoring.poll_interval_seconds`` 60 -> 2 and ``free_slots_after_run_end_seconds``
  300 -> 5: the same monitoring on a test's clock (the killed run's ``training`` slot is otherwise
  held for five minutes after it was failed, and every later training waits for it);
- ``code_servers.local_startup_timeout``: the daemon's code server on two busy cores.

Set up as deploy/README.md says to install: the pools ``training`` and ``promotion`` are created
before the first backfill. No MLflow server: the three data-preparation runs open the embedded
store together on a fresh storage root, so its creation is serialized by the product itself.

Run config of the backfill (what a person sets in the launchpad), not instance settings: the
in-process executor (one process per run pod instead of one per step: CI time; pools are claimed
per step either way), a short training that checkpoints every 5 steps, and gate margins any model
meets (``baseline_margin: -1``: the baseline rule applies and fills its row; the tiny model is not
what is judged here, and a refused gate would fail the retry this test follows).

Everything is asserted from the instance's run records and event log, the cluster side through the
API server. Skipped without a PostgreSQL server or the plane's binaries locally; fails in CI
(``CI=true``) without them (the plane is built on first use there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import kubernetes
import pytest
import yaml
from dagster._core.events import DagsterEventType
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.storage.tags import BACKFILL_ID_TAG, PARENT_RUN_ID_TAG, WILL_RETRY_TAG
from dagster._core.utils import make_new_backfill_id

from finetune_assets.core.io.contracts import BASELINE_MODEL, CHAMPION_MODEL, FINETUNED_MODEL
from finetune_assets_tests.chart_instance import instance_settings
from finetune_assets_tests.core.launchers.k8s.plane import (
    PLANE_DIR_ENV,
    ControlPlane,
    binaries_built,
    install_namespace,
    running_plane,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
PER_CLASS = 100  # Positive and Negative reviews per version: quick to tokenize and train
LABELS = {"labels": ["Negative", "Positive"], "label_mapping": {"-1": "Negative", "1": "Positive"}}
DROPS = (("v1", "PROD.csv", 0), ("v2", "RES2.csv", 0), ("v3", "PROD.csv", PER_CLASS))
RETRY_NUMBER_TAG = "dagster/retry_number"
# fp32: bf16 autocast on a CPU without bf16 units trains the tiny BERT at ~6 samples/s
TRAIN = {
    "epochs": 2,
    "batch_size": 4,
    "max_length": 64,
    "num_workers": 0,
    "accelerator": "cpu",
    "precision": "32",
    "checkpoint_every_n_steps": 5,
    "log_every_n_steps": 50,
}
GATE = {"baseline_margin": -1.0, "must_beat_majority_baseline": False}
RUN_CONFIG = {
    "execution": {"config": {"in_process": {}}},
    "ops": {
        FINETUNED_MODEL: {"config": TRAIN},
        f"{FINETUNED_MODEL}_quality_gate": {"config": {**GATE, "tolerance": 1.0}},
        CHAMPION_MODEL: {"config": GATE},
    },
}
DEADLINE_S = 780.0
# Settled for one automation tick (30 s) and more: the automation sensor may still request a
# version's benchmark_scores after the backfill's last run ended.
QUIET_S = 40.0
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def _drops(tmp: Path, arabic_reviews: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    drops = {}
    for key, name, skip in DROPS:
        table = pacsv.read_csv(
            arabic_reviews / name,
            convert_options=pacsv.ConvertOptions(column_types={"polarity": pa.string()}),
        )
        rows = [  # PER_CLASS of each class: every class above min_rows_per_class
            table.filter(pc.equal(table["polarity"], label)).slice(skip, PER_CLASS)
            for label in ("1", "-1")
        ]
        out = tmp / "drops" / key
        out.mkdir(parents=True)
        pacsv.write_csv(pa.concat_tables(rows).select(["text", "polarity"]), out / "reviews.csv")
        (out / "_labels.json").write_text(json.dumps(LABELS))
        drops[key] = out
    return drops


def _instance_file(
    home: Path, db_url: str, kubeconfig: str, namespace: str, pod_env: list[str]
) -> dict:
    settings = instance_settings(db_url)  # the chart's storage block, scheme included
    settings["run_launcher"] = {
        "module": "dagster_k8s",
        "class": "K8sRunLauncher",
        "config": {
            "service_account_name": "finetune-launcher",
            "instance_config_map": "dagster-instance",  # the chart's; the launcher mounts none
            "dagster_home": str(home),
            "job_namespace": namespace,
            "load_incluster_config": False,
            "kubeconfig_file": kubeconfig,
            "job_image": "finetune-assets:test",
            "image_pull_policy": "IfNotPresent",
            "env_vars": pod_env,
        },
    }
    settings["run_monitoring"].update(poll_interval_seconds=2, free_slots_after_run_end_seconds=5)
    settings["code_servers"] = {"local_startup_timeout": 600}
    return settings


def test_a_three_version_backfill_on_the_deployment_survives_a_killed_run_worker(
    tmp_path, postgres_url, arabic_reviews, _tiny_model_session, monkeypatch
):
    home, root = tmp_path / "home", tmp_path / "storage"
    home.mkdir()
    root.mkdir()
    env = {
        "DAGSTER_HOME": str(home),
        "FINETUNE_ASSETS_ROOT": str(root),
        "FINETUNE_ASSETS_LANDING": str(tmp_path / "landing"),
        "DAGSTER_DISABLE_TELEMETRY": "yes",
        "DAGSTER_GRPC_TIMEOUT_SECONDS": "300",  # code-server calls on two busy cores (default 60)
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # What the run pods get (the chart: the user deployment's env); PYTHONPATH only where a
    # checkout is not the installed package (a worktree)
    pod_env = ["FINETUNE_ASSETS_ROOT", "FINETUNE_ASSETS_LANDING", "DAGSTER_DISABLE_TELEMETRY"]
    pod_env += ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else []

    if not (os.environ.get("CI") == "true" or os.environ.get(PLANE_DIR_ENV) or binaries_built()):
        pytest.skip("the local plane's binaries are not built: .ci/k8s/control-plane build")
    namespace = f"deploy-{uuid.uuid4().hex[:6]}"
    with running_plane(tmp_path / "plane") as plane:
        settings = _instance_file(home, postgres_url, plane.kubeconfig, namespace, pod_env)
        (home / "dagster.yaml").write_text(yaml.safe_dump(settings))
        _namespace(plane, namespace, (home / "dagster.yaml").read_text())
        (home / "workspace.yaml").write_text(
            "load_from:\n  - python_module:\n      module_name: finetune_assets.definitions\n"
            f"      working_directory: {REPO}\n"
        )
        instance = dg.DagsterInstance.from_config(str(home))
        cluster = _Cluster(plane, namespace)
        try:
            versions, facts = _backfill_with_a_kill(
                instance, cluster, home, root, tmp_path, arabic_reviews, _tiny_model_session, env
            )
            _check(instance, cluster, versions, facts)
        finally:
            instance.dispose()


class _Cluster:
    """The plane as this test sees it: one namespace, the API, the pods' processes."""

    def __init__(self, plane: ControlPlane, namespace: str):
        client = plane.api_client()
        self.plane, self.namespace = plane, namespace
        self.core = kubernetes.client.CoreV1Api(client)
        self.batch = kubernetes.client.BatchV1Api(client)

    def pods(self) -> list:
        return self.core.list_namespaced_pod(self.namespace).items

    def live_processes(self) -> list[str]:
        """This namespace's pod processes still running on the nodes."""
        return self.plane.live_pod_processes(self.namespace)


def _namespace(plane: ControlPlane, name: str, instance_yaml: str) -> None:
    """deploy/'s namespace and RBAC in a namespace of the test's own, and the instance ConfigMap
    the chart renders (``dagster-instance``, mounted by the run pods at ``$DAGSTER_HOME``).
    """
    install_namespace(plane, name)
    kubernetes.client.CoreV1Api(plane.api_client()).create_namespaced_config_map(
        name, {"metadata": {"name": "dagster-instance"}, "data": {"dagster.yaml": instance_yaml}}
    )


def _stop(daemon: subprocess.Popen) -> None:
    """The daemon and its code server (one process group)."""
    os.killpg(daemon.pid, signal.SIGTERM)
    try:
        daemon.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(10)


def _backfill_with_a_kill(instance, cluster, home, root, tmp, arabic_reviews, tiny, env) -> tuple:
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.core.labels.infer import read_manifest
    from finetune_assets.core.sources import SourceSpec
    from finetune_assets.definitions import build_defs
    from finetune_assets.defs.jobs import VERSION_CHAIN
    from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
    from finetune_assets.defs.versions.register import write_version

    began = time.time()
    defs = build_defs(str(root))
    store = Storage(str(root))
    drops = _drops(tmp, arabic_reviews)
    versions = sorted(drops)
    for key, drop in drops.items():
        write_version(store, key, SourceSpec(uri=str(drop)), labels=read_manifest(str(drop)))
    instance.add_dynamic_partitions(DATASET_VERSIONS, versions)
    base = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection={dg.AssetKey("pretrained_model")}
    )
    run_config = {"ops": {"pretrained_model": {"config": {"source": str(tiny)}}}}
    assert base.execute_in_process(instance=instance, run_config=run_config).success

    # The install step deploy/README.md prescribes: the pools exist before the first backfill
    # (created lazily instead, the queue's first pass does not see them and every training run
    # starts and waits in its pod; two run workers creating one at once collide on its row)
    for pool in ("training", "promotion"):
        instance.event_log_storage.set_concurrency_slots(pool, 1)

    # Submitted first, as a person would from the UI: the daemon's first backfill tick (every 30 s)
    # then picks it up at once
    backfill_id = make_new_backfill_id()
    instance.add_backfill(
        PartitionBackfill.from_asset_partitions(
            backfill_id=backfill_id,
            asset_graph=defs.resolve_asset_graph(),
            partition_names=versions,
            asset_selection=[a.key for a in VERSION_CHAIN],
            backfill_timestamp=time.time(),
            tags={},
            dynamic_partitions_store=instance,
            all_partitions=False,
            title="three versions",
            description=None,
            run_config=RUN_CONFIG,
        )
    )
    facts: dict = {"began": began, "backfill_id": backfill_id, "submitted": time.time()}
    daemon = subprocess.Popen(
        [sys.executable, "-m", "dagster._daemon", "run", "-w", str(home / "workspace.yaml")],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=open(tmp / "daemon.log", "w"),  # noqa: SIM115 - the daemon's lifetime
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        quiet_since = None
        while quiet_since is None or time.time() - quiet_since < QUIET_S:
            assert time.time() - began < DEADLINE_S, _stuck(instance, backfill_id, cluster)
            if "killed_run" not in facts:
                _kill_a_training(instance, cluster, root, backfill_id, facts)
            if _settled(instance, backfill_id, versions):
                quiet_since = quiet_since or time.time()
            else:
                quiet_since = None
            time.sleep(0.25 if "killed_run" not in facts else 2.0)
        facts["wall_s"] = round(time.time() - began, 1)
        facts["backfill_status"] = instance.get_backfill(backfill_id).status.value
    except BaseException:
        daemon_log = (tmp / "daemon.log").read_text()[-6000:]
        print(f"daemon log (tail):\n{daemon_log}")
        raise
    finally:
        _stop(daemon)
    return versions, facts


def _kill_a_training(
    instance, cluster: _Cluster, root: Path, backfill_id: str, facts: dict
) -> None:
    """SIGKILL the pod processes of a started training run once its first checkpoint exists."""
    for run in instance.get_runs(
        dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}, statuses=[dg.DagsterRunStatus.STARTED])
    ):
        if not _trains(run):
            continue
        version = _version(run)
        if not list(root.glob(f"{FINETUNED_MODEL}/{version}/checkpoints/*/last.ckpt")):
            continue
        pods = [
            p.metadata.name
            for p in cluster.core.list_namespaced_pod(
                cluster.namespace, label_selector=f"dagster/run-id={run.run_id}"
            ).items
            if p.status.phase == "Running"
        ]
        if pods and cluster.plane.kill_pod(cluster.namespace, pods[0], signal.SIGKILL):
            facts.update(killed_run=run.run_id, killed_pod=pods[0], killed_at=time.time())
            return


def _settled(instance, backfill_id: str, versions: list[str]) -> bool:
    """Every run of the backfill ended, every failed run the daemon retries has a finished retry,
    no other run is in flight (the automation sensor requests ``benchmark_scores[v]`` once a
    version's model and baseline exist), and the backfill says it is done (or every version got
    its ``champion_model`` decision: the backfill daemon notices only on its next 30 s tick).
    """
    if instance.get_runs(dg.RunsFilter(statuses=IN_FLIGHT), limit=1):
        return False
    runs = instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
    for run in runs:
        if not run.is_finished:
            return False
        if run.tags.get(WILL_RETRY_TAG) == "true" and not _retried(instance, run):
            return False
    if runs and instance.get_backfill(backfill_id).status != BulkActionStatus.REQUESTED:
        return True
    return bool(runs) and all(_materialized(instance, CHAMPION_MODEL, v) for v in versions)


def _retried(instance, run) -> bool:
    children = instance.get_runs(dg.RunsFilter(tags={PARENT_RUN_ID_TAG: run.run_id}))
    return bool(children) and all(c.is_finished for c in children)


def _materialized(instance, asset: str, version: str):
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[version]), limit=1
    ).records
    return records[0] if records else None


def _trains(run) -> bool:
    return dg.AssetKey(FINETUNED_MODEL) in (run.asset_selection or ())


def _version(run) -> str | None:
    return run.tags.get("dagster/partition") or run.tags.get("dagster/asset_partition_range_start")


def _step_window(instance, run_id: str, step: str) -> tuple[float | None, float | None]:
    """When ``step`` started and ended in a run (end None: it never ended, e.g. killed)."""
    start = end = None
    for entry in instance.all_logs(
        run_id,
        of_type={
            DagsterEventType.STEP_START,
            DagsterEventType.STEP_SUCCESS,
            DagsterEventType.STEP_FAILURE,
        },
    ):
        if entry.step_key != step:
            continue
        if entry.dagster_event_type == DagsterEventType.STEP_START:
            start = entry.timestamp
        else:
            end = entry.timestamp
    return start, end


def _stuck(instance, backfill_id: str, cluster: _Cluster) -> str:
    runs = instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
    lines = [f"{r.run_id[:8]} {_version(r)} {r.status.value} {sorted(r.tags)}" for r in runs]
    return "backfill did not settle:\n" + "\n".join(lines) + f"\npods: {cluster.live_processes()}"


def _check(instance, cluster: _Cluster, versions: list[str], facts: dict) -> None:
    backfill_id = facts["backfill_id"]
    records = instance.get_run_records(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
    killed_id = facts.get("killed_run")
    assert killed_id, "no training run was seen running with a checkpoint: nothing was killed"
    retries = instance.get_run_records(dg.RunsFilter(tags={PARENT_RUN_ID_TAG: killed_id}))
    known = {r.dagster_run.run_id for r in records}
    records += [r for r in retries if r.dagster_run.run_id not in known]
    t0 = facts["submitted"]

    def at(ts: float | None) -> float | None:
        return None if ts is None else round(ts - t0, 1)

    preparations = [r for r in records if not _trains(r.dagster_run)]
    trainings = [r for r in records if _trains(r.dagster_run)]
    # Data preparation and training are separate runs (their backfill policies differ)
    prep_keys = {dg.AssetKey(k) for k in ("raw_reviews", "tokenized_reviews", "mds_shards")}
    assert not [r for r in trainings if prep_keys & set(r.dagster_run.asset_selection or ())]
    assert sorted(_version(r.dagster_run) for r in preparations) == versions

    # Exactly one training at a time: the finetuned_model steps (what holds the "training" slot)
    # never overlap; a step that never ended (the killed one) holds it until its run was failed.
    windows = []
    for r in trainings:
        start, end = _step_window(instance, r.dagster_run.run_id, FINETUNED_MODEL)
        if start is not None:
            end = end if end is not None else r.end_time
            windows.append((start, end, r.dagster_run.run_id, r.start_time))
    windows.sort()
    assert len(windows) == 4, windows  # three versions, one of them twice (the killed + retry)
    for (_, end, first, _), (start, _, second, _) in zip(windows, windows[1:], strict=False):
        assert end <= start, f"trainings {first[:8]} and {second[:8]} overlapped"

    # Every version's data preparation started before the first training ended: no preparation
    # waited for the training slot
    first_training_end = windows[0][1]
    assert all(r.start_time < first_training_end for r in preparations)

    # The killed run: failed by run monitoring (the launcher's health check of its Job), retried
    # by the daemon once, and the retry finished the version
    killed = instance.get_run_record_by_id(killed_id)
    assert killed.dagster_run.status == dg.DagsterRunStatus.FAILURE
    failure = [
        e.dagster_event.message
        for e in instance.all_logs(killed_id, of_type=DagsterEventType.RUN_FAILURE)
    ]
    assert failure and "Detected run worker status" in failure[-1], failure
    assert "K8s job" in failure[-1], failure[-1]
    (retry,) = retries
    assert retry.dagster_run.tags.get(RETRY_NUMBER_TAG) == "1"
    assert retry.dagster_run.status == dg.DagsterRunStatus.SUCCESS
    killed_version = _version(killed.dagster_run)
    model = _materialized(instance, FINETUNED_MODEL, killed_version)
    assert model.run_id == retry.dagster_run.run_id
    resumed = model.asset_materialization.metadata.get("resumed_at_step")
    assert resumed is not None and resumed.value > 0, "the retry did not resume the checkpoint"

    # Every version trained; its baseline came before its gate, whose table applied it
    evaluations: dict[str, list] = {}
    for r in trainings:
        for e in instance.all_logs(
            r.dagster_run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
        ):
            data = e.dagster_event.event_specific_data
            if data.check_name == "quality_gate":
                evaluations.setdefault(data.partition or _version(r.dagster_run), []).append(e)
    gates = {}
    for version in versions:
        assert _materialized(instance, FINETUNED_MODEL, version), version
        baseline = _materialized(instance, BASELINE_MODEL, version)
        assert baseline and evaluations.get(version), version
        evaluation = min(evaluations[version], key=lambda e: e.timestamp)
        assert baseline.timestamp < evaluation.timestamp, version
        meta = evaluation.dagster_event.event_specific_data.metadata
        assert "baseline_macro_f1" in meta, sorted(meta)
        gates[version] = round(meta["baseline_macro_f1"].value, 4)

    # Nothing left running: every run-worker Job ended, no pod process alive (finished Jobs stay
    # until their ttlSecondsAfterFinished, as on a cluster)
    jobs = cluster.batch.list_namespaced_job(cluster.namespace).items
    ended = {"Complete", "Failed"}
    assert all(ended & {c.type for c in j.status.conditions or []} for j in jobs)
    assert cluster.live_processes() == []
    assert all(p.status.phase in ("Succeeded", "Failed") for p in cluster.pods())
    killed_job = next(j for j in jobs if killed_id[:8] in j.metadata.name)
    assert "Failed" in {c.type for c in killed_job.status.conditions}
    # the real Job controller's verdict on a run worker killed once (backoffLimit 0)
    assert (killed_job.status.failed, killed_job.status.active or 0) == (1, 0)

    summary = {
        "wall_s": facts["wall_s"],
        "backfill_status": facts["backfill_status"],
        "runs": len(records),
        "jobs": len(jobs),
        "preparation_starts_s": sorted(at(r.start_time) for r in preparations),
        # per training run: run pod started, finetuned_model step started / ended
        "training_runs_s": [(rid[:8], at(r), at(s), at(e)) for s, e, rid, r in windows],
        "killed": killed_id[:8],
        "killed_at_s": at(facts["killed_at"]),
        "failed_by_monitoring_after_s": round(killed.end_time - facts["killed_at"], 1),
        "retry": retry.dagster_run.run_id[:8],
        "retry_started_s": at(retry.start_time),
        "resumed_at_step": resumed.value,
        "gate_baseline_macro_f1": gates,
    }
    print("deployment backfill:", json.dumps(summary, sort_keys=True))
