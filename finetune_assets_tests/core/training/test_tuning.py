"""``tuning_study``: trials trained and pruned through a launcher, resumed after a kill, winner."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import dagster as dg
import optuna
import pytest

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.launchers.base import TrainingSpec
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.trial.study_storage import STORAGE_ENV
from finetune_assets.core.tuning import study as tuning
from finetune_assets.defs.models.finetuned import finetuned_model
from finetune_assets.defs.resources.launchers import TrainingLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.tuning.space import TuningConfig
from finetune_assets.defs.tuning.study_asset import study_storage, tuning_study
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets_tests.core.training.fixtures import publish_upstream

# 48 train samples, batch 8 or 16: at most 6 batches an epoch; 4 steps, 2 reports (at steps 2, 4).
STUDY = {
    "n_trials": 3,
    "trial_max_steps": 4,
    "reports_per_trial": 2,
    "batch_size": [8],
    "epochs": [1],
    "pruner_startup_trials": 1,
    "pruner_warmup_reports": 0,
    "sampler_startup_trials": 1,
    "fixed": {
        "accelerator": "cpu",
        "precision": "32",
        "num_workers": 0,
        "log_every_n_steps": 1,
        "checkpoint_every_n_steps": 50,
        "max_length": 64,
    },
}
FINETUNE = {
    "accelerator": "cpu",
    "precision": "32",
    "num_workers": 0,
    "max_steps": 4,
    "log_every_n_steps": 1,
    "checkpoint_every_n_steps": 50,
    "max_length": 64,
}


class InProcessLauncher(TrainingLauncher):
    """Runs the trainer's ``train()`` in this process on the config file the asset wrote.

    Fakes torchrun (no subprocess, no rendezvous: world size 1). Real: the trainer config written,
    read back as JSON, the trainer, Lightning, the study storage the trainer reports to, MLflow.
    ``interrupt_at`` raises what Dagster raises in a run being terminated, after that many launches
    (the trial in flight is left RUNNING in the study, as a killed run leaves it).
    """

    journal: str  # one line per launch (Dagster copies resources: a list field would not come back)
    interrupt_at: int = -1

    def launches(self) -> list[str]:
        path = Path(self.journal)
        return path.read_text().splitlines() if path.exists() else []

    def launch(self, context: dg.AssetExecutionContext, job: TrainingSpec) -> None:
        from finetune_assets.core.training.run import train

        if len(self.launches()) == self.interrupt_at:
            raise dg.DagsterExecutionInterruptedError("run terminated")
        with open(self.journal, "a") as f:
            f.write(job.name + "\n")
        train(TrainerConfig.from_json(job.config_url))


def _materialize(
    assets, instance, root: Path, launcher: TrainingLauncher, config: dict, name: str, **more
):
    return dg.materialize(
        assets,
        partition_key="v1",
        instance=instance,
        raise_on_error=False,
        run_config=dg.RunConfig(
            ops={name: {"config": config}, **{k: {"config": v} for k, v in more.items()}}
        ),
        resources={
            "storage": StorageResource(root=str(root)),
            "launcher": launcher,
            "mlflow": MlflowResource(ui_base_url="http://mlflow.example:5000"),
        },
    )


@pytest.fixture
def version(storage_root, instance, tiny_model_dir, arabic_reviews) -> Storage:
    store = Storage(str(storage_root))
    publish_upstream(store, "v1", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(48, 16, 16))
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    return store


def _study(store: Storage, config: dict = STUDY) -> optuna.Study:
    url = study_storage(TuningConfig(), store, "v1")
    name = tuning.study_name("v1", TuningConfig(**config))
    return optuna.load_study(study_name=name, storage=tuning.open_storage(url))


def test_a_killed_study_resumes_to_exactly_n_trials_and_the_final_model_uses_the_best(
    version, storage_root, instance, tmp_path
):
    first = InProcessLauncher(journal=str(tmp_path / "first.txt"), interrupt_at=1)
    killed = _materialize([tuning_study], instance, storage_root, first, STUDY, "tuning_study")
    assert not killed.success
    left = {t.number: t for t in _study(version).trials}
    assert (
        left[0].state == optuna.trial.TrialState.COMPLETE and left[0].user_attrs["default_recipe"]
    )
    assert left[1].state == optuna.trial.TrialState.RUNNING  # what a kill leaves behind

    launcher = InProcessLauncher(journal=str(tmp_path / "second.txt"))
    resumed = _materialize([tuning_study], instance, storage_root, launcher, STUDY, "tuning_study")
    assert resumed.success
    trials = {t.number: t for t in _study(version).trials}
    finished = [t for t in trials.values() if t.state in tuning.FINISHED]
    assert len(finished) == 3 and len(launcher.launches()) == 2  # trial 0 was not run again
    assert trials[1].state == optuna.trial.TrialState.FAIL
    assert trials[2].user_attrs[tuning.RETRY_OF] == 1 and trials[2].params == trials[1].params

    meta = resumed.asset_materializations_for_node("tuning_study")[0].metadata
    table = meta["trials"].value
    assert table.splitlines()[0].startswith("| trial | state | val macro-F1 | seconds | reports |")
    assert "| 1 | fail |" in table and "| 2 | " in table
    assert meta["optimization_history"].value.startswith(
        "![optimization history](data:image/png;base64,"
    )
    assert meta["param_importance"].value.startswith(
        "![parameter importance](data:image/png;base64,"
    )
    best = json.loads((Path(version.require("tuning_study", "v1").url) / "best.json").read_text())
    assert best["trial"] == meta["best_trial"].value and best["params"] == meta["best_params"].value

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{storage_root}/mlflow/mlflow.db")
    parent = _study(version).user_attrs[tuning.MLFLOW_RUN]
    exp = client.get_experiment_by_name("review-classifier").experiment_id
    nested = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent}'")
    # one nested run per trained trial (trial 1 was killed before its trainer started)
    assert sorted(r.data.tags["trial_number"] for r in nested) == ["0", "2", "3"]
    assert all(r.data.params["lr"] == r.data.tags["trial_param.lr"] for r in nested)

    # A run that trains finetuned_model skips the study (never a side effect of a whole-graph run).
    final = _materialize(
        [finetuned_model, tuning_study],
        instance,
        storage_root,
        InProcessLauncher(journal=str(tmp_path / "f")),
        {**FINETUNE, "hyper_parameters_from": "study"},
        "finetuned_model",
        tuning_study=STUDY,
    )
    assert final.success and not final.asset_materializations_for_node("tuning_study")
    assert len(_study(version).trials) == 4
    fmeta = final.asset_materializations_for_node("finetuned_model")[0].metadata
    assert fmeta["tuned_from_trial"].value == best["trial"]
    trainer = json.loads(
        (Path(version.require("finetuned_model", "v1").url) / "trainer_config.json").read_text()
    )
    assert {k: trainer[k] for k in best["params"]} == best["params"]
    assert trainer["mlflow"]["tags"]["tuned_from_trial"] == str(best["trial"])


def test_the_pruner_stops_a_trial_worse_than_the_median_early(
    version, storage_root, instance, tmp_path
):
    url = study_storage(TuningConfig(), version, "v1")
    study = tuning.open_study(TuningConfig(**{**STUDY, "include_default_recipe": False}), url, "v1")
    space = TuningConfig(**STUDY)
    dists = {"lr": optuna.distributions.FloatDistribution(space.lr_low, space.lr_high, log=True)}
    # A finished trial with a perfect score at both reports: any real trial is below its median.
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 1e-4},
            distributions=dists,
            value=1.0,
            intermediate_values={1: 1.0, 2: 1.0},
        )
    )
    result = _materialize(
        [tuning_study],
        instance,
        storage_root,
        InProcessLauncher(journal=str(tmp_path / "l")),
        {**STUDY, "n_trials": 2, "include_default_recipe": False},
        "tuning_study",
    )
    assert result.success
    pruned = _study(version, {**STUDY, "include_default_recipe": False}).trials[1]
    assert pruned.state == optuna.trial.TrialState.PRUNED
    # pruned at its first report (report 1), taken at optimizer step 2
    assert list(pruned.intermediate_values) == [1] and pruned.user_attrs["pruned_at_step"] == 2
    metrics = json.loads(
        (storage_root / "tuning" / "v1" / "trials" / "0001" / "output" / "metrics.json").read_text()
    )
    assert metrics["global_step"] == 2  # stopped at the first report, not at trial_max_steps (4)
    # trials validate only: the test split scores the final model, once
    assert metrics["macro_f1"] is None and metrics["test_skipped"].startswith("a tuning trial")
    assert (
        "| 1 | pruned |"
        in result.asset_materializations_for_node("tuning_study")[0].metadata["trials"].value
    )


def test_a_resumed_study_draws_new_points(tmp_path):
    """A sampler's state is not in the storage: seeded alike, a second run would redraw the first
    run's points (the same trial twice); the seed moves on with the study's trials.
    """
    config = TuningConfig(include_default_recipe=False)
    url = str(tmp_path / "study.journal")
    first = tuning.open_study(config, url, "v1")
    trial = first.ask()
    drawn = config.suggest(trial)
    first.tell(trial, 0.5)
    again = tuning.open_study(config, url, "v1")  # the next run, a new process
    assert config.suggest(again.ask()) != drawn


def test_the_search_space_rejects_what_it_cannot_search():
    with pytest.raises(ValueError, match="lr_low"):
        TuningConfig(lr_low=1e-3, lr_high=1e-4)
    with pytest.raises(ValueError, match="searched or budget"):
        TuningConfig(fixed={"lr": 1e-3})
    with pytest.raises(ValueError, match="accelerater"):
        TuningConfig(fixed={"accelerater": "cpu"})
    with pytest.raises(ValueError, match="class_weights"):
        TuningConfig(class_weights=["inverse"])


def test_a_remote_root_needs_a_database_url():
    with pytest.raises(dg.Failure, match="storage_url"):
        study_storage(TuningConfig(), Storage("memory://root"), "v1")
    assert (
        study_storage(
            TuningConfig(storage_url="postgresql://db/optuna"), Storage("memory://root"), "v1"
        )
        == "postgresql://db/optuna"
    )


_TWO_IN_FLIGHT = threading.Barrier(2, timeout=120)


class ReportingLauncher(TrainingLauncher):
    """Fakes the trainer (and the cluster): reports a score derived from ``lr`` to the trial through
    the study storage, as ``TrialPruning`` does, once two launches are in flight together (a
    barrier: the test fails, rather than waits, if trials do not run in parallel). Real: the trainer
    config file, the study storage, the asset's parallel trial loop and the labels a gang is keyed
    by.
    """

    journal: str

    def launch(self, context: dg.AssetExecutionContext, job: TrainingSpec) -> None:
        cfg = TrainerConfig.from_json(job.config_url)
        with open(self.journal, "a") as f:
            f.write(json.dumps({"labels": dict(job.labels), "env": dict(job.env)}) + "\n")
        _TWO_IN_FLIGHT.wait()
        study = optuna.load_study(
            study_name=cfg.trial.study_name, storage=tuning.open_storage(cfg.trial.storage)
        )
        optuna.trial.Trial(study, cfg.trial.trial_id).report(cfg.lr * 1000, cfg.max_steps)


def test_parallel_trials_run_as_separate_gangs(version, storage_root, instance, tmp_path):
    from finetune_assets.core.launchers.k8s import gang_key

    launcher = ReportingLauncher(journal=str(tmp_path / "launches.jsonl"))
    config = {**STUDY, "n_trials": 4, "parallel_trials": 2, "pruner": "none"}
    result = _materialize([tuning_study], instance, storage_root, launcher, config, "tuning_study")
    assert result.success
    launches = [json.loads(line) for line in Path(launcher.journal).read_text().splitlines()]
    assert len(launches) == 4 and len({gang_key(la["labels"]) for la in launches}) == 4
    states = [t.state for t in _study(version).trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 4


class ScoringLauncher(TrainingLauncher):
    """Fakes the trainer: reports ``lr * 1000`` once to the trial, through the storage the trial
    config names, in an environment with the spec's ``env`` (as torchrun's workers get it); fails
    the launches numbered in ``fail`` as a failed training does. Real: the trainer config file,
    the study storage, the asset's trial loop.
    """

    journal: str
    fail: list[int] = []

    def launches(self) -> list[str]:
        path = Path(self.journal)
        return path.read_text().splitlines() if path.exists() else []

    def launch(self, context: dg.AssetExecutionContext, job: TrainingSpec) -> None:
        from finetune_assets.core.launchers.base import TrainingFailed

        path = Path(self.journal)
        n = len(path.read_text().splitlines()) if path.exists() else 0
        with open(path, "a") as f:
            f.write(json.dumps({"env": sorted(job.env)}) + "\n")
        if n in self.fail:
            raise TrainingFailed(f"launch {n}: exit 1")
        cfg = TrainerConfig.from_json(job.config_url)
        saved = dict(os.environ)
        os.environ.update(job.env)
        try:
            study = optuna.load_study(
                study_name=cfg.trial.study_name, storage=tuning.open_storage(cfg.trial.storage)
            )
            study._storage.set_trial_intermediate_value(cfg.trial.trial_id, 1, cfg.lr * 1000)
        finally:
            os.environ.clear()
            os.environ.update(saved)


def _mlflow_status(storage_root: Path, run_id: str) -> str:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{storage_root}/mlflow/mlflow.db")
    return client.get_run(run_id).info.status


def test_failed_trials_never_count_and_are_capped(version, storage_root, instance, tmp_path):
    config = {**STUDY, "n_trials": 2, "pruner": "none", "max_failed_trials": 2}
    launcher = ScoringLauncher(journal=str(tmp_path / "a.jsonl"), fail=[1])
    result = _materialize([tuning_study], instance, storage_root, launcher, config, "tuning_study")
    assert result.success
    study = _study(version, config)
    states = [t.state.name for t in study.trials]
    # exactly n_trials finished: the failed one was replaced, not counted
    assert states == ["COMPLETE", "FAIL", "COMPLETE"]
    meta = result.asset_materializations_for_node("tuning_study")[0].metadata
    assert meta["trials_failed_in_training"].value == 1 and meta["study_complete"].value is True
    assert _mlflow_status(storage_root, study.user_attrs[tuning.MLFLOW_RUN]) == "FINISHED"

    # every launch fails: the run stops at the cap (not at n_trials launches), the study's MLflow
    # run is FAILED, not RUNNING for ever
    other = {**config, "lr_low": 1e-4, "lr_high": 2e-4}
    launcher = ScoringLauncher(journal=str(tmp_path / "b.jsonl"), fail=list(range(10)))
    failed = _materialize([tuning_study], instance, storage_root, launcher, other, "tuning_study")
    assert not failed.success and len(launcher.launches()) == 2
    study = _study(version, other)
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    assert _mlflow_status(storage_root, study.user_attrs[tuning.MLFLOW_RUN]) == "FAILED"


def test_recover_leaves_a_live_runs_trials_alone(tmp_path):
    config = TuningConfig(include_default_recipe=False)
    study = tuning.open_study(config, str(tmp_path / "study.journal"), "v1")
    for owner in ("live-run", "dead-run"):
        trial = study.ask()
        config.suggest(trial)
        trial.set_user_attr(tuning.OWNER, owner)
    requeued = tuning.recover(study, alive=lambda run: run == "live-run")
    assert requeued == [1]
    states = {t.user_attrs.get(tuning.OWNER): t.state.name for t in study.trials}
    assert states == {"live-run": "RUNNING", "dead-run": "FAIL", None: "WAITING"}


def test_a_changed_space_is_another_study(tmp_path):
    url = str(tmp_path / "study.journal")
    first = tuning.open_study(TuningConfig(), url, "v1")
    same = tuning.open_study(TuningConfig(n_trials=20, timeout_minutes=5), url, "v1")
    assert same.study_name == first.study_name  # more trials, same study
    other = TuningConfig(lr_low=1e-4, lr_high=2e-4)
    moved = tuning.open_study(other, url, "v1")
    fixed = tuning.open_study(TuningConfig(fixed={"max_length": 48}), url, "v1")
    assert len({first.study_name, moved.study_name, fixed.study_name}) == 3
    assert tuning.earlier_studies(url, "v1", moved.study_name) == sorted(
        [first.study_name, fixed.study_name]
    )
    assert moved.user_attrs[tuning.CONFIG]["lr_low"] == 1e-4


@pytest.fixture
def postgres_with_password():
    """A database on the test server and a role with a password (.ci/test_postgres.sh)."""
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    server = os.environ.get("FINETUNE_TEST_POSTGRES_URL")
    if not server:
        pytest.skip("FINETUNE_TEST_POSTGRES_URL is not set (source .ci/test_postgres.sh)")
    import psycopg2

    name, secret = f"tune_{uuid.uuid4().hex[:10]}", f"pw-{uuid.uuid4().hex}"
    admin = psycopg2.connect(server)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{secret}'")
        cur.execute(f"CREATE DATABASE {name} OWNER {name}")
    parts = urlsplit(server)
    netloc = f"{name}:{secret}@{parts.hostname}:{parts.port}"
    try:
        url = parts._replace(scheme="postgresql+psycopg2", netloc=netloc, path=f"/{name}")
        yield urlunsplit(url), secret
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            cur.execute(f"DROP ROLE IF EXISTS {name}")
        admin.close()


def test_no_storage_credentials_under_the_storage_root(
    version, storage_root, instance, tmp_path, postgres_with_password
):
    url, secret = postgres_with_password
    config = {**STUDY, "n_trials": 2, "pruner": "none", "storage_url": url}
    launcher = ScoringLauncher(journal=str(tmp_path / "l.jsonl"))
    result = _materialize([tuning_study], instance, storage_root, launcher, config, "tuning_study")
    assert result.success
    assert all(la["env"] == [STORAGE_ENV] for la in map(json.loads, launcher.launches()))
    trial_configs = list((storage_root / "tuning").rglob("trainer_config.json"))
    assert len(trial_configs) == 2
    leaks = [
        p for p in storage_root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()
    ]
    assert leaks == []
    assert json.loads(trial_configs[0].read_text())["trial"]["storage"] == f"env:{STORAGE_ENV}"


def test_a_failed_study_of_a_new_version_falls_back_to_the_default_recipe(
    version, storage_root, instance, tmp_path
):
    """``tune_new_versions``: the sensor's tune run whose study found nothing ends without a study,
    the final run it leads to trains the default recipe (tagged why), and the summary says so.
    """
    from finetune_assets.cli.summary import format_summary, version_summary
    from finetune_assets.core.tuning.tags import AUTO_TUNE_TAG, FALLBACK_TAG
    from finetune_assets.defs.tuning.on_landing import winner_request

    config = {**STUDY, "n_trials": 2, "pruner": "none", "max_failed_trials": 1}
    launcher = ScoringLauncher(journal=str(tmp_path / "l.jsonl"), fail=[0])
    result = dg.materialize(
        [tuning_study],
        partition_key="v1",
        instance=instance,
        tags={AUTO_TUNE_TAG: "true"},
        run_config=dg.RunConfig(ops={"tuning_study": {"config": config}}),
        resources={
            "storage": StorageResource(root=str(storage_root)),
            "launcher": launcher,
            "mlflow": MlflowResource(ui_base_url="http://mlflow.example:5000"),
        },
    )
    assert result.success and not result.asset_materializations_for_node("tuning_study")
    request = winner_request(instance.get_run_by_id(result.run_id), instance)
    assert isinstance(request, dg.RunRequest) and request.run_key.endswith(":fallback")
    assert request.run_config == {}  # finetuned_model's defaults: the default recipe
    assert "found no completed trial" in request.tags[FALLBACK_TAG]

    summary = version_summary(version, "v1", None)
    assert summary["tuning"]["complete"] is False
    assert summary["tuning"]["model"] == "the default recipe"
    assert "tuning: study tuning-v1-" in format_summary(summary)
    assert "failed: no completed trial" in format_summary(summary)


def test_a_cut_short_study_of_a_new_version_falls_back_too(
    version, storage_root, instance, tmp_path
):
    from finetune_assets.core.tuning.tags import AUTO_TUNE_TAG, FALLBACK_TAG
    from finetune_assets.defs.tuning.on_landing import winner_request

    # 3 trials asked for, the second fails and the cap is 1: one finished trial, published
    config = {**STUDY, "n_trials": 3, "pruner": "none", "max_failed_trials": 1}
    launcher = ScoringLauncher(journal=str(tmp_path / "l.jsonl"), fail=[1])
    result = dg.materialize(
        [tuning_study],
        partition_key="v1",
        instance=instance,
        tags={AUTO_TUNE_TAG: "true"},
        run_config=dg.RunConfig(ops={"tuning_study": {"config": config}}),
        resources={
            "storage": StorageResource(root=str(storage_root)),
            "launcher": launcher,
            "mlflow": MlflowResource(ui_base_url="http://mlflow.example:5000"),
        },
    )
    meta = result.asset_materializations_for_node("tuning_study")[0].metadata
    assert meta["study_complete"].value is False and meta["study_stopped"].value == "failures"
    request = winner_request(instance.get_run_by_id(result.run_id), instance)
    assert (
        isinstance(request, dg.RunRequest) and "cut short (failures)" in request.tags[FALLBACK_TAG]
    )


def test_a_new_versions_study_starts_from_the_previous_versions_best(
    version, storage_root, instance, tmp_path, tiny_model_dir, arabic_reviews
):
    config = {**STUDY, "n_trials": 3, "pruner": "none", "warm_start_trials": 2}
    launcher = ScoringLauncher(journal=str(tmp_path / "a.jsonl"))
    assert _materialize([tuning_study], instance, storage_root, launcher, config, "tuning_study")
    first = _study(version, config)
    top = sorted(first.trials, key=lambda t: t.value, reverse=True)[:2]

    publish_upstream(version, "v2", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(48, 16, 16))
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v2"])
    result = dg.materialize(
        [tuning_study],
        partition_key="v2",
        instance=instance,
        run_config=dg.RunConfig(ops={"tuning_study": {"config": config}}),
        resources={
            "storage": StorageResource(root=str(storage_root)),
            "launcher": ScoringLauncher(journal=str(tmp_path / "b.jsonl")),
            "mlflow": MlflowResource(ui_base_url="http://mlflow.example:5000"),
        },
    )
    assert result.success
    url = study_storage(TuningConfig(), version, "v2")
    name = tuning.study_name("v2", TuningConfig(**config))
    second = optuna.load_study(study_name=name, storage=tuning.open_storage(url))
    warmed = [t for t in second.trials if tuning.WARM_START in t.user_attrs]
    assert [t.user_attrs[tuning.WARM_START] for t in warmed] == [
        f"v1/trial {t.number}" for t in top
    ]
    assert [t.params for t in warmed] == [t.params for t in top]
    assert second.trials[0].user_attrs["default_recipe"]  # the recipe first, as always
