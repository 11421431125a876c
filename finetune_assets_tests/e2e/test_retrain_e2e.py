"""End to end: a drop in the landing folder -> sensor (registration) -> automation's runs (real
torchrun, real MLflow) -> quality gate.

What the product promises: new data turns into a model without a person in the loop, the
first model becomes ``@champion``, and a worse model never takes the alias. Everything below is the
real code location (``build_defs``) on a real Dagster instance; only the daemon is played by the
test (apply the landing tick's partition requests; evaluate the automation conditions with
Dagster's own evaluation and launch the runs they request in-process, with the run config a person
would set) and the model is the tiny BERT, so the whole flow fits in a few minutes on two cores.
``test_automation_daemon.py`` runs the same path through the real daemon.
"""

from pathlib import Path

import dagster as dg
import pyarrow.csv as pacsv
import pytest
from dagster._core.storage.asset_check_execution_record import (
    AssetCheckExecutionRecordStatus as Status,
)
from mlflow import MlflowClient

from finetune_assets.core.io.contracts import FINETUNED_MODEL as FINETUNED
from finetune_assets.core.io.contracts import PRETRAINED_MODEL as PRETRAINED
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.sources.sample import make_sample_reviews
from finetune_assets.definitions import build_defs
from finetune_assets.defs.jobs import DATA_PREPARATION
from finetune_assets.defs.jobs import VERSION_CHAIN as CHAIN_ASSETS
from finetune_assets.defs.resources.launchers import LocalTorchrunLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets_tests.defs.automation_ticks import Ticks

VERSION_CHAIN = tuple(a.key.to_user_string() for a in CHAIN_ASSETS)  # names, in flow order
PREPARE = tuple(a.key.to_user_string() for a in DATA_PREPARATION)

REPO = Path(__file__).resolve().parents[2]
MODEL = "review-classifier"
GATE = dg.AssetCheckKey(dg.AssetKey(FINETUNED), "quality_gate")

# Small but real training on the tiny BERT: AdamW with a high lr learns the built-in sample's
# polarity words; short sequences and no loader workers keep it quick on CPU. Two epochs give a
# clearly-better-than-chance first model (one epoch of the randomly initialised tiny model can still
# sit at the majority class, which the gate now refuses); four epochs learn the sample almost
# perfectly and are the "new hyper-parameters, no new data" retrain at the end. Unweighted loss: one
# short epoch then leaves room for a longer run to be measurably better (the default balanced
# weights already get the tiny model near 1.0 in one epoch on the sample, leaving none).
TRAIN = {
    "epochs": 2,
    "batch_size": 16,
    "optimizer": "adamw",
    "lr": 5e-3,
    "max_length": 64,
    "num_workers": 0,
    "accelerator": "cpu",
    "log_every_n_steps": 50,
    "checkpoint_every_n_steps": 1000,
    "class_weights": "none",
    # The scores above were calibrated in fp32 without length bucketing; the gate's logic is under
    # test here, not the fast defaults (those are measured in benchmarks/defaults.py and trained in
    # test_user_path.py).
    "precision": "32",
    "bucket_batches": 1,
}
LONGER = {**TRAIN, "epochs": 4}
# The forced worse model: one optimizer step with a negligible lr leaves the pretrained_model's
# randomly initialised classification head as it was. Same base, same dataset version, same test
# split as the first model, so the only difference the gate can see is the training itself: an
# honest comparison.
UNTRAINED = {**TRAIN, "lr": 1e-9, "max_steps": 1}


# baseline_model runs in retrain_job (the gate's bar), but on these reviews TF-IDF scores 1.0, which
# the tiny BERT cannot reach: the rule is off here so that the champion comparison is what is tested
# (test_gate_defaults.py tests the baseline rule; test_quality_assets.py its table).
BASELINE_OFF = {"config": {"baseline_margin": None}}


def _run_config(finetune: dict, base: Path | None = None) -> dg.RunConfig:
    ops = {
        FINETUNED: {"config": finetune},
        "finetuned_model_quality_gate": BASELINE_OFF,
        "champion_model": BASELINE_OFF,
    }
    if base is not None:
        ops[PRETRAINED] = {"config": {"source": str(base)}}
    return dg.RunConfig(ops=ops)


class Deployment:
    """The code location on one instance, with the part of the sensor daemon the test plays."""

    def __init__(self, instance: dg.DagsterInstance, storage_root: Path):
        self.instance = instance
        self.defs = build_defs(
            str(storage_root), launcher=LocalTorchrunLauncher(nproc_per_node=1, cwd=str(REPO))
        )
        self.repo = self.defs.get_repository_def()
        self.cursor: str | None = None
        # its first tick is the first build() (what it requests then is launched)
        self.automation = Ticks(instance, self.defs)
        self.tracking_uri = MlflowResource().resolve_tracking_uri(Storage(str(storage_root)))

    def tick(self) -> dg.SensorResult:
        sensor = self.repo.get_sensor_def("landing_zone_sensor")
        # Direct invocation takes resources explicitly: the deployment's own (landing, storage).
        ctx = dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            repository_def=self.repo,
            resources=self.defs.resources,
        )
        result = sensor(ctx)
        assert isinstance(result, dg.SensorResult)
        for req in result.dynamic_partitions_requests or []:
            assert isinstance(req, dg.AddDynamicPartitionsRequest)
            self.instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        self.cursor = result.cursor
        return result

    def automate(self) -> list[dg.RunRequest]:
        """The runs version_automation requests on its next tick."""
        self.automation.tick()
        return self.automation.run_requests()

    def launch(self, request: dg.RunRequest, run_config: dg.RunConfig) -> dg.ExecuteInProcessResult:
        """What the daemon does with an automation run request (``run_config``: what a person
        would set, for the ops the run has).
        """
        selected = {k.to_user_string() for k in request.asset_selection}
        if FINETUNED in selected:
            selected.add("finetuned_model_quality_gate")
        ops = {k: v for k, v in run_config.ops.items() if k in selected}
        job = self.repo.get_implicit_global_asset_job_def()
        return job.execute_in_process(
            instance=self.instance,
            partition_key=request.partition_key,
            asset_selection=request.asset_selection,
            run_config=dg.RunConfig(ops=ops),
            tags=request.tags,
            raise_on_error=False,
        )

    def build(self, run_config: dg.RunConfig) -> list[tuple[set[str], dg.ExecuteInProcessResult]]:
        """Launch what automation requests, tick after tick, until it requests nothing."""
        done = []
        for _ in range(6):
            requests = self.automate()
            if not requests:
                return done
            for request in requests:
                names = {k.to_user_string() for k in request.asset_selection}
                done.append((names, self.launch(request, run_config)))
        raise AssertionError(f"automation still requests runs after {len(done)}: {done}")

    def run_job(
        self, name: str, partition: str, run_config: dg.RunConfig
    ) -> dg.ExecuteInProcessResult:
        return self.repo.get_job(name).execute_in_process(
            instance=self.instance,
            partition_key=partition,
            run_config=run_config,
            raise_on_error=False,
        )

    def run_gate(self, partition: str) -> dg.AssetCheckEvaluation:
        """Only the quality_gate for one version, as re-executing the check from the UI does."""
        job = self.repo.get_implicit_global_asset_job_def().get_subset(asset_check_selection={GATE})
        result = job.execute_in_process(
            instance=self.instance,
            partition_key=partition,
            raise_on_error=False,
            run_config={"ops": {"finetuned_model_quality_gate": BASELINE_OFF}},
        )
        (evaluation,) = result.get_asset_check_evaluations()
        return evaluation

    def champion(self) -> str:
        return str(
            MlflowClient(self.tracking_uri).get_model_version_by_alias(MODEL, "champion").version
        )

    def gate_history(self) -> list:
        """Every recorded quality_gate execution, oldest first, as the instance's event log
        stores them.
        """
        records = self.instance.event_log_storage.get_asset_check_execution_history(GATE, limit=20)
        return sorted(records, key=lambda r: r.id)


def _registered_version(result: dg.ExecuteInProcessResult) -> str:
    mat = result.asset_materializations_for_node(FINETUNED)[-1]
    return str(mat.metadata["registered_model_version"].value)


@pytest.mark.slow
def test_new_data_trains_promotes_and_a_worse_model_is_refused(
    instance, storage_root, tiny_model_dir, tmp_path, monkeypatch
):
    landing = tmp_path / "landing"
    # LandingZoneResource's default location
    monkeypatch.setenv("FINETUNE_ASSETS_LANDING", str(landing))
    # the embedded SQLite store under the root
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    deploy = Deployment(instance, storage_root)

    # -- v1 lands: the built-in sample reviews (English, polarity words a tiny model learns), as a
    # folder
    drop = landing / "v1"
    drop.mkdir(parents=True)
    pacsv.write_csv(make_sample_reviews(), drop / "reviews.csv")
    (drop / "_SUCCESS").write_text("")

    tick = deploy.tick()
    assert instance.get_dynamic_partitions(DATASET_VERSIONS) == ["v1"]
    assert not tick.run_requests  # the sensor registers; automation builds
    # Fresh deployment: the shared base model first; the version's data, then (a run of its own,
    # queued for the training slot) its model, gate, promotion and benchmark scores
    built = deploy.build(_run_config(TRAIN, base=tiny_model_dir))
    assert all(result.success for _, result in built), [n for n, r in built if not r.success]
    runs = [names for names, _ in built]
    training = {FINETUNED, "champion_model", "benchmark_scores"}
    assert runs[-1] == training
    assert set().union(*runs[:-1]) == {*PREPARE, PRETRAINED}  # no data step in the training run
    assert {PRETRAINED} in runs[:-1]  # shared by every version: a run of its own
    first = built[-1][1]
    materialized = [e for _, r in built for e in r.get_asset_materialization_events()]
    # the first promotion also reports the unpartitioned champion asset
    assert {e.asset_key.to_user_string() for e in materialized} == {
        *VERSION_CHAIN,
        PRETRAINED,
        "champion",
        "benchmark_scores",
    }
    checks = {e.check_name: e for _, r in built for e in r.get_asset_check_evaluations()}
    # raw + shard checks ran before training; the blocking ones passed (training started after them)
    assert all(
        checks[n].passed
        for n in (
            "schema_and_labels",
            "rejected_share",
            "min_rows_per_class",
            "splits_readable",
            "counts_match_tokenized",
            "no_empty_split",
        )
    )
    gate = checks["quality_gate"]
    first_version = _registered_version(first)
    meta = gate.metadata
    assert gate.passed and "first model" in meta["decision"].value
    assert meta["registered_model"].value == f"{MODEL} v{first_version}"
    # The model really learned: far above always predicting the majority class on the frozen test
    # split.
    assert meta["challenger_macro_f1"].value > meta["majority_baseline_macro_f1"].value + 0.2
    assert deploy.champion() == first_version

    tick = deploy.tick()  # repeated ticks: nothing new
    assert not tick.run_requests and not tick.dynamic_partitions_requests
    assert deploy.automate() == []

    # -- retrain without new data, forced worse: finetune_only_job on the same version
    worse = deploy.run_job("finetune_only_job", "v1", _run_config(UNTRAINED))
    assert not worse.success  # the blocking gate failed the run
    # the trainer registered it; only the alias is withheld
    worse_version = _registered_version(worse)
    assert worse_version != first_version
    (refused,) = [e for e in worse.get_asset_check_evaluations() if e.check_name == "quality_gate"]
    assert not refused.passed and refused.severity == dg.AssetCheckSeverity.ERROR
    meta = refused.metadata
    assert meta["registered_model"].value == f"{MODEL} v{worse_version}"
    assert meta["champion"].value == f"{MODEL} v{first_version}"
    assert meta["test_data"].value == gate.metadata["test_data"].value  # the same test reviews
    assert meta["champion_macro_f1"].value == pytest.approx(
        gate.metadata["challenger_macro_f1"].value
    )
    assert meta["challenger_macro_f1"].value < meta["champion_macro_f1"].value
    assert meta["delta_macro_f1"].value < 0 and "refused" in meta["decision"].value
    assert deploy.champion() == first_version  # the alias did not move

    # A cache miss (as when a newer version brings other test data): the gate re-scores the champion
    # from its MLflow artifact, through the deployment's registry, and reaches the same scores and
    # decision.
    client = MlflowClient(deploy.tracking_uri)
    cached = client.get_model_version(MODEL, first_version).tags
    # not rounded
    assert float(cached["gate.macro_f1"]) == gate.metadata["challenger_macro_f1"].value
    client.delete_model_version_tag(MODEL, first_version, "gate.test_data")
    again = deploy.run_gate("v1")
    assert not again.passed and again.metadata["champion"].value == f"{MODEL} v{first_version}"
    assert again.metadata["champion_macro_f1"].value == pytest.approx(
        gate.metadata["challenger_macro_f1"].value
    )
    assert again.metadata["challenger_macro_f1"].value == meta["challenger_macro_f1"].value
    assert (
        client.get_model_version(MODEL, first_version).tags["gate.test_data"]
        == meta["test_data"].value
    )
    assert deploy.champion() == first_version

    # The instance's event log holds both decisions, in order, for v1, with the scores a person acts
    # on.
    history = deploy.gate_history()
    assert [(r.status, r.partition) for r in history] == [
        (Status.SUCCEEDED, "v1"),
        (Status.FAILED, "v1"),
        (Status.FAILED, "v1"),
    ]
    assert [r.run_id for r in history[:2]] == [first.run_id, worse.run_id]
    stored = history[1].event.dagster_event.event_specific_data
    assert (
        isinstance(stored, dg.AssetCheckEvaluation)
        and stored.severity == dg.AssetCheckSeverity.ERROR
    )
    assert stored.metadata["champion_macro_f1"].value > stored.metadata["challenger_macro_f1"].value
    assert stored.metadata["decision"].value == meta["decision"].value

    # -- retrain with new hyper-parameters (more epochs), no new data: a better-or-equal model takes
    # the alias
    better = deploy.run_job("finetune_only_job", "v1", _run_config(LONGER))
    assert better.success
    better_version = _registered_version(better)
    (promoted,) = [
        e for e in better.get_asset_check_evaluations() if e.check_name == "quality_gate"
    ]
    meta = promoted.metadata
    assert promoted.passed and meta["decision"].value.startswith("will promote")
    # compared with the first model, not the refused one
    assert meta["champion"].value == f"{MODEL} v{first_version}"
    # ~1.0 vs ~0.6 today
    assert meta["challenger_macro_f1"].value >= meta["champion_macro_f1"].value
    assert deploy.champion() == better_version
    # the asset acted, the check observed
    by_key = {
        m.asset_key.to_user_string(): m
        for m in better.asset_materializations_for_node("champion_model")
    }
    decision, report = by_key["champion_model"], by_key["champion"]  # and the champion asset's
    assert f"v{better_version}" in report.metadata["champions"].value
    assert (
        decision.metadata["decision"].value.startswith("promoted")
        and decision.metadata["promoted"].value
    )
    assert [r.status for r in deploy.gate_history()][-1] == Status.SUCCEEDED

    # MLflow shows the decision on each version, not only the alias.
    assert (
        client.get_model_version(MODEL, worse_version).tags["gate.decision"].startswith("refused")
    )
    for version in (first_version, better_version):
        assert client.get_model_version(MODEL, version).tags["gate.decision"].startswith("promoted")


@pytest.mark.slow
def test_a_retried_finetuned_model_reuses_its_registered_version(
    storage_root, instance, tiny_model_dir, arabic_reviews
):
    """A retry (same inputs + config) resumes the finished checkpoint and finds its version by
    training key: exactly one registered version, and the alias it holds does not move.
    """
    from finetune_assets.defs.models.finetuned import finetuned_model
    from finetune_assets.defs.resources.storage_root import StorageResource
    from finetune_assets_tests.core.training.fixtures import publish_upstream

    store = Storage(str(storage_root))
    publish_upstream(store, "v1", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(24, 6, 6))
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    resources = {
        "storage": StorageResource(root=str(storage_root)),
        "mlflow": MlflowResource(),
        "launcher": LocalTorchrunLauncher(nproc_per_node=1, cwd=str(REPO)),
    }
    run_config = dg.RunConfig(ops={FINETUNED: {"config": {**TRAIN, "max_steps": 1}}})
    first = dg.materialize(
        [finetuned_model],
        partition_key="v1",
        instance=instance,
        resources=resources,
        run_config=run_config,
    )
    version = _registered_version(first)
    client = MlflowClient(MlflowResource().resolve_tracking_uri(store))
    client.set_registered_model_alias(MODEL, "champion", version)
    retry = dg.materialize(
        [finetuned_model],
        partition_key="v1",
        instance=instance,
        resources=resources,
        run_config=run_config,
    )
    assert _registered_version(retry) == version
    assert [str(mv.version) for mv in client.search_model_versions(f"name = '{MODEL}'")] == [
        version
    ]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == version
