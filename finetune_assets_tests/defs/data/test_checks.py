"""Asset checks on real reviews: the data contract, shard integrity, and the model quality gate."""

import shutil
from pathlib import Path

import dagster as dg
import pytest
import torch

from finetune_assets.core.evaluation.gate_rules import TestSet
from finetune_assets.core.io.storage import Storage, hash_tree
from finetune_assets.core.labels.infer import LABEL2ID
from finetune_assets.core.sources import SourceSpec
from finetune_assets.defs.data import mds_shards_integrity, raw_reviews_contract
from finetune_assets.defs.data.mds_shards import mds_shards
from finetune_assets.defs.data.pretrained import pretrained_model
from finetune_assets.defs.data.raw import raw_reviews
from finetune_assets.defs.data.tokenized import tokenized_reviews
from finetune_assets.defs.models.finetuned import finetuned_model
from finetune_assets.defs.promotion import champion_model, quality_gate
from finetune_assets.defs.resources.launchers import LocalTorchrunLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets.defs.versions.register import write_version

ALL = [
    raw_reviews,
    pretrained_model,
    tokenized_reviews,
    mds_shards,
    finetuned_model,
    champion_model,
    raw_reviews_contract,
    mds_shards_integrity,
    quality_gate,
]
DATA_CHAIN = dg.AssetSelection.assets("raw_reviews", "tokenized_reviews", "mds_shards")


def _resources(storage_root: Path) -> dict:
    return {
        "storage": StorageResource(root=str(storage_root)),
        "mlflow": MlflowResource(),
        "launcher": LocalTorchrunLauncher(),
    }


def _build_base(instance, storage_root: Path, model_dir: Path) -> None:
    result = dg.materialize(
        ALL,
        selection=dg.AssetSelection.assets("pretrained_model"),
        instance=instance,
        resources=_resources(storage_root),
        run_config=dg.RunConfig(ops={"pretrained_model": {"config": {"source": str(model_dir)}}}),
    )
    assert result.success


def _run(
    instance, storage_root: Path, version: str, source: Path, selection=DATA_CHAIN, run_config=None
):
    if not instance.has_dynamic_partition(DATASET_VERSIONS, version):
        write_version(Storage(str(storage_root)), version, SourceSpec(uri=str(source)))
        instance.add_dynamic_partitions(DATASET_VERSIONS, [version])
    return dg.materialize(
        ALL,
        selection=selection,
        partition_key=version,
        instance=instance,
        resources=_resources(storage_root),
        raise_on_error=False,
        run_config=run_config,
    )


def _checks(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


@pytest.fixture
def base(instance, storage_root, tiny_model_dir):
    _build_base(instance, storage_root, tiny_model_dir)
    return tiny_model_dir


def test_contract_and_shards_pass_on_real_reviews(
    instance, storage_root, base, arabic_reviews, tmp_path
):
    drop = tmp_path / "v1"
    drop.mkdir()
    shutil.copy(arabic_reviews / "PROD.csv", drop)
    result = _run(instance, storage_root, "v1", drop)
    assert result.success
    checks = _checks(result)
    assert {n: c.passed for n, c in checks.items()} == {
        "schema_and_labels": True,
        "rejected_share": True,
        "duplicate_share": True,
        "min_rows_per_class": True,
        "splits_readable": True,
        "counts_match_tokenized": True,
        "no_empty_split": True,
    }
    per_class = checks["min_rows_per_class"].metadata["rows_per_class"].value
    # two reviews appear twice with different labels: no majority, so both copies of each are
    # quarantined
    assert per_class == {"Positive": 3094, "Negative": 862, "Mixed": 306}
    assert checks["duplicate_share"].metadata["conflicting_duplicates"].value == 4
    assert "| test |" in checks["counts_match_tokenized"].metadata["splits"].value
    assert all(c.target_materialization_data is not None or True for c in checks.values())


def test_bad_labels_block_tokenization(instance, storage_root, base, arabic_reviews, tmp_path):
    drop = tmp_path / "bad.csv"
    lines = (arabic_reviews / "PROD.csv").read_text(encoding="utf-8").splitlines()
    # Every fourth review gets a label outside the mapping, and no review is Mixed any more.
    out = [lines[0]]
    for i, line in enumerate(lines[1:]):
        text, _, label = line.rpartition(",")
        out.append(f"{text},{'7' if i % 4 == 0 else ('1' if label == '0' else label)}")
    drop.write_text("\n".join(out) + "\n", encoding="utf-8")
    result = _run(instance, storage_root, "bad", drop)
    checks = _checks(result)
    assert (
        not checks["rejected_share"].passed
        and checks["rejected_share"].severity == dg.AssetCheckSeverity.ERROR
    )
    assert (
        checks["rejected_share"].metadata["rejected_by_reason"].value.get("unknown_label", 0) > 1000
    )
    assert "unknown_label" in checks["rejected_share"].metadata["examples"].value
    assert not checks["min_rows_per_class"].passed
    assert checks["min_rows_per_class"].metadata["rows_per_class"].value["Mixed"] == 0
    # A class with no review at all: the fix says how to declare the data's own classes.
    assert "_labels.json" in checks["min_rows_per_class"].metadata["fix"].value
    assert checks["schema_and_labels"].passed  # what was accepted is still well-formed
    # Blocking ERROR checks: nothing downstream of raw_reviews ran for this version.
    materialized = {
        m.asset_key.to_user_string()
        for m in result.get_asset_materialization_events()
        for m in [m.event_specific_data.materialization]
    }
    assert materialized == {"raw_reviews"}
    assert Storage(str(storage_root)).current("tokenized_reviews", "bad") is None


def test_duplicates_warn_without_blocking(instance, storage_root, base, arabic_reviews, tmp_path):
    drop = tmp_path / "dups.csv"
    lines = (arabic_reviews / "PROD.csv").read_text(encoding="utf-8").splitlines()
    drop.write_text("\n".join(lines + lines[1:1200]) + "\n", encoding="utf-8")
    result = _run(instance, storage_root, "dups", drop)
    check = _checks(result)["duplicate_share"]
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert result.success and Storage(str(storage_root)).current("mds_shards", "dups") is not None


def test_threshold_is_check_config(instance, storage_root, base, arabic_reviews):
    result = _run(
        instance,
        storage_root,
        "v1",
        arabic_reviews / "PROD.csv",
        run_config=dg.RunConfig(
            ops={"raw_reviews_contract": {"config": {"min_rows_per_class": 400}}}
        ),
    )
    check = _checks(result)["min_rows_per_class"]
    assert not check.passed and "Mixed" in check.description
    # blocked by config
    assert Storage(str(storage_root)).current("tokenized_reviews", "v1") is None


def test_shard_integrity_catches_corruption_and_drift(instance, storage_root, base, arabic_reviews):
    assert _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv").success
    store = Storage(str(storage_root))
    shards = Path(store.require("mds_shards", "v1").url)
    (shards / "validation" / "index.json").write_text("{not json")
    # raw_reviews + tokenized_reviews re-made with another split rule: the shards no longer match
    # them
    result = _run(
        instance,
        storage_root,
        "v1",
        arabic_reviews / "PROD.csv",
        selection=dg.AssetSelection.assets("raw_reviews", "tokenized_reviews").without_checks()
        | dg.AssetSelection.checks_for_assets(mds_shards),
        run_config=dg.RunConfig(ops={"raw_reviews": {"config": {"test_fraction": 0.2}}}),
    )
    checks = _checks(result)
    assert (
        not checks["splits_readable"].passed
        and "validation" in checks["splits_readable"].description
    )
    assert not checks["counts_match_tokenized"].passed
    assert "test" in checks["counts_match_tokenized"].metadata["mismatches"].value


def test_training_refuses_shards_whose_latest_integrity_check_failed_in_another_run(
    instance, storage_root, base, arabic_reviews
):
    """A blocking check stops its own run's downstream steps only: training in a run of its own (an
    asset backfill's) must still refuse shards whose latest integrity evaluation failed.
    """
    assert _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv").success
    shards = Path(Storage(str(storage_root)).require("mds_shards", "v1").url)
    (shards / "validation" / "index.json").write_text("{not json")
    rechecked = _run(  # the check re-run in a run without mds_shards, as from the UI
        instance,
        storage_root,
        "v1",
        arabic_reviews / "PROD.csv",
        selection=dg.AssetSelection.assets(tokenized_reviews).without_checks()
        | dg.AssetSelection.checks_for_assets(mds_shards),
    )
    assert not _checks(rechecked)["splits_readable"].passed

    trained = _run(
        instance,
        storage_root,
        "v1",
        arabic_reviews / "PROD.csv",
        selection=dg.AssetSelection.assets(finetuned_model).without_checks(),
    )
    assert not trained.success
    (failure,) = [e for e in trained.all_events if e.is_step_failure]
    info = failure.step_failure_data.user_failure_data
    assert "refused" in info.description and "mds_shards:splits_readable" in info.description
    assert not (storage_root / "finetuned_model" / "v1" / "checkpoints").exists()  # never launched
    # Repaired and re-materialized (its checks run with it), the version trains again: no stale
    # verdict sticks.
    assert _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv").success
    from finetune_assets.defs.dagster_internals import failed_check_evaluations
    from finetune_assets.defs.data.upstream_checks import BLOCKING_INPUT_CHECKS

    assert failed_check_evaluations(instance, BLOCKING_INPUT_CHECKS, "v1") == {}


# -- quality gate ----------------------------------------------------------------------------------


def _biased_model(src: Path, dst: Path, label: str) -> Path:
    """The tiny BERT with its head forced to predict one class: a known, cheap score for the
    gate.
    """
    from transformers import BertForSequenceClassification

    shutil.copytree(src, dst)
    model = BertForSequenceClassification.from_pretrained(dst)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.fill_(-10.0)
        model.classifier.bias[LABEL2ID[label]] = 10.0
    model.save_pretrained(dst, safe_serialization=True)
    return dst


def _register_challenger(instance, storage_root: Path, version: str, model_dir: Path) -> str:
    """What finetuned_model leaves behind: a published model folder, a registered MLflow version and
    Dagster's materialization record naming both (what the gate and promotion act on).
    """
    import mlflow

    store = Storage(str(storage_root))
    resource = MlflowResource()
    uri = resource.resolve_tracking_uri(store)
    # Only a client bound to this store: setting the process-wide URI would hide a gate that forgets
    # its own.
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(resource.experiment_name)
    exp_id = (
        exp.experiment_id
        if exp
        else client.create_experiment(
            resource.experiment_name, artifact_location=resource.artifact_location(store)
        )
    )
    run = client.create_run(exp_id)
    client.log_artifacts(run.info.run_id, str(model_dir), "model")
    client.set_terminated(run.info.run_id)
    try:
        client.create_registered_model(resource.registered_model_name)
    except mlflow.exceptions.MlflowException:
        pass
    mv = client.create_model_version(
        resource.registered_model_name,
        f"runs:/{run.info.run_id}/model",
        run_id=run.info.run_id,
        tags={"dataset_version": version},
    )
    with store.publish("finetuned_model", version) as staging:
        shutil.copytree(model_dir, staging.local_dir / "model")
        staging.data_version = hash_tree(staging.local_dir)
        staging.metadata = {
            "mlflow": {
                "registered_model_name": resource.registered_model_name,
                "registered_model_version": int(mv.version),
                "run_id": run.info.run_id,
            }
        }
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            "finetuned_model",
            partition=version,
            metadata={
                "model_path": dg.MetadataValue.path(f"{staging.url}/model"),
                "registered_model_name": resource.registered_model_name,
                "registered_model_version": int(mv.version),
            },
        )
    )
    return str(mv.version)


# These tests are about which model is compared and when the alias moves, with biased stand-in
# models near the majority class: the deployment has turned the majority and baseline rules off
# (test_gate_defaults.py covers the defaults).
RULES_OFF = {"must_beat_majority_baseline": False, "baseline_margin": None}


def _gate(instance, storage_root, version):
    """The gate alone, for one version (as re-executing the check from the UI does)."""
    result = dg.materialize(
        ALL,
        selection=dg.AssetSelection.checks_for_assets(finetuned_model),
        instance=instance,
        resources=_resources(storage_root),
        raise_on_error=False,
        tags={"dagster/partition": version},
        run_config=dg.RunConfig(ops={"finetuned_model_quality_gate": {"config": RULES_OFF}}),
    )
    return _checks(result)["quality_gate"]


def _promote(instance, storage_root, version) -> dg.ExecuteInProcessResult:
    """champion_model alone for one version (a person's click, or a backfill of an old version)."""
    return dg.materialize(
        ALL,
        selection=dg.AssetSelection.assets(champion_model),
        instance=instance,
        resources=_resources(storage_root),
        raise_on_error=False,
        partition_key=version,
        run_config=dg.RunConfig(ops={"champion_model": {"config": RULES_OFF}}),
    )


def _decision(result: dg.ExecuteInProcessResult) -> str:
    (mat,) = [
        m
        for m in result.asset_materializations_for_node("champion_model")
        if m.asset_key == dg.AssetKey("champion_model")  # not the champion report beside it
    ]
    return mat.metadata["decision"].value


def _client(storage_root):
    import mlflow

    return mlflow.MlflowClient(MlflowResource().resolve_tracking_uri(Storage(str(storage_root))))


def _champion(storage_root) -> str:
    return str(
        _client(storage_root).get_model_version_by_alias("review-classifier", "champion").version
    )


def test_gate_observes_and_champion_model_promotes_only_strictly_better(
    instance, storage_root, base, arabic_reviews, tmp_path
):
    assert _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv").success
    good = _biased_model(base, tmp_path / "good", "Positive")  # majority class: macro-F1 ~0.28
    bad = _biased_model(base, tmp_path / "bad", "Mixed")  # rare class: macro-F1 ~0.05

    first = _register_challenger(instance, storage_root, "v1", good)
    check = _gate(instance, storage_root, "v1")
    assert check.passed and "first model" in check.metadata["decision"].value
    # the check only observes
    assert _client(storage_root).get_registered_model("review-classifier").aliases == {}
    assert "first model" in _decision(_promote(instance, storage_root, "v1"))
    assert _champion(storage_root) == first
    # the unpartitioned champion asset shows it, with its dataset version, score and since when
    shown = instance.get_latest_materialization_event(dg.AssetKey("champion"))
    assert shown.asset_materialization.partition is None
    table = shown.asset_materialization.metadata["champions"].value
    row = next(line for line in table.splitlines() if "review-classifier" in line)
    assert f"| v{first} | v1 | 0." in row and "20" in row.split("|")[-2]  # since: an ISO time
    reports = len(instance.fetch_materializations(dg.AssetKey("champion"), limit=10).records)

    worse = _register_challenger(instance, storage_root, "v1", bad)
    check = _gate(instance, storage_root, "v1")
    assert not check.passed and check.severity == dg.AssetCheckSeverity.ERROR
    meta = check.metadata
    assert meta["challenger_macro_f1"].value < meta["champion_macro_f1"].value
    assert meta["champion"].value == f"review-classifier v{first}"
    assert "refused" in meta["decision"].value and _champion(storage_root) == first
    # alone, it applies the rule itself
    assert "refused" in _decision(_promote(instance, storage_root, "v1"))
    assert worse != first and _champion(storage_root) == first
    # a refusal moves nothing: no new champion report
    champion_reports = instance.fetch_materializations(dg.AssetKey("champion"), limit=10)
    assert len(champion_reports.records) == reports

    # A new version with a bigger test split: the champion is re-scored on *this* test data; a
    # challenger exactly as good passes the gate but does not take the alias (a tie keeps the
    # champion).
    drop = tmp_path / "v2"
    drop.mkdir()
    for f in ("PROD.csv", "RES2.csv"):
        shutil.copy(arabic_reviews / f, drop)
    assert _run(instance, storage_root, "v2", drop).success
    _register_challenger(
        instance, storage_root, "v2", _biased_model(base, tmp_path / "good2", "Positive")
    )
    check = _gate(instance, storage_root, "v2")
    meta = check.metadata
    assert check.passed and meta["champion_dataset_version"].value == "v1"
    assert meta["champion_macro_f1"].value == pytest.approx(meta["challenger_macro_f1"].value)
    assert meta["test_reviews"].value > 500
    result = _promote(instance, storage_root, "v2")
    assert (
        result.success and "refused" in _decision(result) and "does not beat" in _decision(result)
    )
    assert _champion(storage_root) == first


def test_retraining_an_old_version_after_a_newer_champion_keeps_the_champion(
    instance, storage_root, base, arabic_reviews, tmp_path
):
    """Order independence: v2's model holds the alias; v1 (registered earlier, a smaller and older
    test split) is retrained with a model that beats it *on v1's split*. Without the rule the
    evaluation order would decide; with it the older version is refused by promotion (its gate
    passes: the gate judges quality, so a backfill in any order fails no run).
    """
    assert _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv").success
    drop = tmp_path / "v2"
    drop.mkdir()
    for f in ("PROD.csv", "RES2.csv"):
        shutil.copy(arabic_reviews / f, drop)
    assert _run(instance, storage_root, "v2", drop).success
    newer = _register_challenger(
        instance, storage_root, "v2", _biased_model(base, tmp_path / "weak", "Mixed")
    )
    assert "first model" in _decision(_promote(instance, storage_root, "v2"))

    older = _register_challenger(
        instance, storage_root, "v1", _biased_model(base, tmp_path / "strong", "Positive")
    )
    check = _gate(instance, storage_root, "v1")
    meta = check.metadata
    # better on v1's own split, which is exactly what must not decide
    assert meta["challenger_macro_f1"].value > meta["champion_macro_f1"].value
    assert check.passed  # the gate judges quality; the order rule is the promotion's
    result = _promote(instance, storage_root, "v1")
    assert result.success and "registered before champion" in _decision(result)
    assert older != newer and _champion(storage_root) == newer


def test_gate_and_promotion_act_on_the_recorded_model_not_current(
    instance, storage_root, base, arabic_reviews, tmp_path
):
    """A gate run alone on an old version: it scores the model its materialization recorded, even
    after another writer moved CURRENT to a foreign model, and cannot move the alias back to an old
    model.
    """
    assert _run(instance, storage_root, "v1", arabic_reviews / "PROD.csv").success
    first = _register_challenger(
        instance, storage_root, "v1", _biased_model(base, tmp_path / "good", "Positive")
    )
    assert _promote(instance, storage_root, "v1").success and _champion(storage_root) == first
    store = Storage(str(storage_root))
    with store.publish(
        "finetuned_model", "v1"
    ) as staging:  # foreign: published, never recorded by Dagster
        _biased_model(base, staging.local_dir / "model", "Mixed")
        staging.data_version = "foreign"
    check = _gate(instance, storage_root, "v1")
    # the recorded (Positive) model
    assert check.passed and check.metadata["challenger_macro_f1"].value > 0.2
    # An old version's model re-promoted alone ties with the champion it already is: nothing moves.
    assert "already holds" in _decision(_promote(instance, storage_root, "v1"))
    assert _champion(storage_root) == first


# -- promotion semantics on a real (SQLite) registry, no training --
# gate.promote is what champion_model runs


@pytest.fixture(scope="module")
def _migrated_registry_db(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store with its schema already created (MLflow's migrations take
    seconds on two cores); each registry test gets its own copy, so the tests stay as isolated as
    with a fresh file.
    """
    import mlflow

    db = tmp_path_factory.mktemp("mlflow-template") / "registry.db"
    mlflow.MlflowClient(
        f"sqlite:///{db}", registry_uri=f"sqlite:///{db}"
    ).search_registered_models()
    return db


class _Registry:
    """A real MLflow SQLite registry with versions whose scores are cached on the test data (no
    model needed).
    """

    def __init__(self, tmp_path: Path, template: Path):
        import mlflow

        shutil.copy(template, tmp_path / "registry.db")
        self.uri = f"sqlite:///{tmp_path}/registry.db"
        self.client = mlflow.MlflowClient(self.uri, registry_uri=self.uri)
        self.test = TestSet.build(["good", "bad"], ["Positive", "Negative"])
        self.client.create_registered_model("m")

    def version(self, score: float) -> str:
        from finetune_assets.core.evaluation import gate_rules as gate

        mv = self.client.create_model_version("m", "file:///nowhere/model")
        gate.remember_score(self.client, "m", str(mv.version), self.test, score)
        return str(mv.version)

    def champion(self) -> str | None:
        holder = self.client.get_registered_model("m").aliases.get("champion")
        return None if holder is None else str(holder)

    def promote(self, version: str, score: float, client=None, lock=None):
        from finetune_assets.core.evaluation import gate_rules as gate

        return gate.promote(
            client or self.client,
            gate.Challenger("m", version, score),
            self.test,
            [gate.beats_champion()],
            self.uri,
            lock=lock,
        )


class _FlakyClient:
    """Wraps a real MlflowClient; the listed reads raise the given MLflow error (a locked SQLite
    store, an outage). Everything else is the real registry, so an alias set by mistake would really
    be set.
    """

    def __init__(self, client, error_code: str, methods=("get_registered_model",)):
        self._client, self._code, self._methods = client, error_code, methods
        self.sets = 0

    def __getattr__(self, name):
        from mlflow.exceptions import MlflowException

        if name in self._methods:

            def fail(*args, **kwargs):
                raise MlflowException(
                    "(sqlite3.OperationalError) database is locked", error_code=self._code
                )

            return fail
        if name == "set_registered_model_alias":
            self.sets += 1
        return getattr(self._client, name)


@pytest.mark.parametrize("code", ["TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "PERMISSION_DENIED"])
def test_registry_errors_fail_promotion_and_leave_the_alias(tmp_path, _migrated_registry_db, code):
    from mlflow.exceptions import MlflowException

    from finetune_assets.core.evaluation import gate_rules as gate

    reg = _Registry(tmp_path, _migrated_registry_db)
    champ = reg.version(0.5)
    reg.client.set_registered_model_alias("m", "champion", champ)
    challenger = reg.version(0.2)
    flaky = _FlakyClient(reg.client, code)
    with pytest.raises(MlflowException):
        gate.current_champion(flaky, "m", reg.test)
    with pytest.raises(MlflowException):
        reg.promote(challenger, 0.2, client=flaky)
    assert flaky.sets == 0 and reg.champion() == champ


def test_only_not_found_means_no_champion(tmp_path, _migrated_registry_db):
    from finetune_assets.core.evaluation import gate_rules as gate

    reg = _Registry(tmp_path, _migrated_registry_db)
    # RESOURCE_DOES_NOT_EXIST
    assert gate.current_champion(reg.client, "never-registered", reg.test) is None
    assert gate.current_champion(reg.client, "m", reg.test) is None  # registered, no alias yet
    first = reg.version(0.3)
    assert "first model" in gate.describe(reg.promote(first, 0.3)) and reg.champion() == first


def test_a_tie_or_a_retry_keeps_the_champion(tmp_path, _migrated_registry_db):
    reg = _Registry(tmp_path, _migrated_registry_db)
    champ = reg.version(0.4)
    reg.promote(champ, 0.4)
    twin = reg.version(0.4)  # a retry that registered a byte-identical model
    result = reg.promote(twin, 0.4)
    assert not result.promotable and reg.champion() == champ
    assert reg.promote(champ, 0.4).holds_alias and reg.champion() == champ


def test_concurrent_promotions_cannot_let_a_worse_model_win(tmp_path, _migrated_registry_db):
    """Barrier between read and set: the worse challenger reads first and sets after the better one.
    Without a critical section both compare with the old champion and the finish order decides
    (worse wins).
    """
    import threading

    from finetune_assets.core.io.storage import Storage

    reg = _Registry(tmp_path, _migrated_registry_db)
    old = reg.version(0.2)
    reg.promote(old, 0.2)
    worse, better = reg.version(0.3), reg.version(0.5)
    better_set = threading.Event()

    class SlowSet:
        """The worse run's client: after reading, it sets only once the better run has set (or
        after 1 s).
        """

        def __getattr__(self, name):
            if name == "set_registered_model_alias":
                better_set.wait(timeout=1.0)
            return getattr(reg.client, name)

    class SignalSet:
        def __getattr__(self, name):
            if name == "set_registered_model_alias":

                def set_alias(*args):
                    reg.client.set_registered_model_alias(*args)
                    better_set.set()

                return set_alias
            return getattr(reg.client, name)

    store = Storage(str(tmp_path / "root"))
    t = threading.Thread(
        target=reg.promote, args=(worse, 0.3, SlowSet(), store.lock("promotion-m"))
    )
    t.start()
    while not t.is_alive():
        pass
    import time

    time.sleep(0.2)  # let the worse run take the lock and read first
    reg.promote(better, 0.5, client=SignalSet(), lock=store.lock("promotion-m"))
    t.join()
    assert reg.champion() == better
