"""baseline_model, vocabulary_fit, the gate's baseline condition, benchmark sets, evaluate and summary, on real
reviews (the shared Arabic files and the packaged English clothing reviews) with the tiny BERT as base model.

One deployment is built per module (base model, two versions, their baselines) and shared by the tests:
materializing is the slow part, the assertions are cheap.
"""

import json
import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from finetune_assets.assets.baseline import baseline_model, read_baseline_info
from finetune_assets.assets.benchmarks import benchmark_scores
from finetune_assets.assets.pretrained import pretrained_model
from finetune_assets.assets.raw import raw_reviews
from finetune_assets.assets.tokenized import tokenized_reviews
from finetune_assets.checks import QualityGateConfig, _baseline_condition
from finetune_assets.cli import main
from finetune_assets.data.default_reviews import REVIEWS_SOURCE, read_default_reviews
from finetune_assets.data.sources import SourceSpec
from finetune_assets.partitions import DATASET_VERSIONS
from finetune_assets.resources.mlflow import MlflowResource
from finetune_assets.resources.storage import StorageResource
from finetune_assets.storage import Storage, hash_tree
from finetune_assets.versions import write_version
from finetune_assets.vocab_check import vocabulary_fit

ASSETS = [raw_reviews, pretrained_model, tokenized_reviews, baseline_model, benchmark_scores, vocabulary_fit]
STARS = '{"1": "Negative", "2": "Negative", "3": "Mixed", "4": "Positive", "5": "Positive"}'


class Deployment:
    def __init__(self, root: Path, instance, model_dir: Path):
        self.root, self.instance, self.model_dir = root, instance, model_dir
        self.store = Storage(str(root))
        self.resources = {"storage": StorageResource(root=str(root)), "mlflow": MlflowResource()}

    def materialize(self, version: str | None, selection, run_config=None) -> dg.ExecuteInProcessResult:
        return dg.materialize(ASSETS, selection=selection, partition_key=version, instance=self.instance,
                              resources=self.resources, run_config=run_config, raise_on_error=False)

    def add_version(self, version: str, source: str) -> dg.ExecuteInProcessResult:
        write_version(self.store, version, SourceSpec(uri=source))
        self.instance.add_dynamic_partitions(DATASET_VERSIONS, [version])
        selection = (dg.AssetSelection.assets("raw_reviews", "tokenized_reviews", "baseline_model").without_checks()
                     | dg.AssetSelection.checks_for_assets(tokenized_reviews))
        return self.materialize(version, selection)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, _tiny_model_session):
    tmp = tmp_path_factory.mktemp("quality")
    (tmp / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp / "home")) as instance:
        d = Deployment(tmp / "storage", instance, _tiny_model_session)
        assert d.materialize(None, dg.AssetSelection.assets("pretrained_model"),
                             dg.RunConfig(ops={"pretrained_model": {"config": {"source": str(d.model_dir)}}})).success
        d.results = {"en": d.add_version("en", REVIEWS_SOURCE)}
        shared = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "arabic_reviews"
        shared = shared if shared.exists() else Path("/work/shared/data/arabic_reviews")
        if (shared / "PROD.csv").exists():
            d.results["ar"] = d.add_version("ar", str(shared / "PROD.csv"))
        yield d


def _check(result, name):
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == name]
    return evaluation


def test_baseline_model_scores_the_frozen_test_split(deployment):
    result = deployment.results["en"]
    assert result.success
    (mat,) = [m for m in result.asset_materializations_for_node("baseline_model")]
    meta = mat.metadata
    info = read_baseline_info(deployment.store, "en")
    assert info["rows"] == {"train": meta["train_reviews"].value, "test": meta["test_samples"].value}
    tokens_stats = deployment.store.read_json(f"{deployment.store.require('tokenized_reviews', 'en').url}/stats.json")
    assert info["rows"]["test"] == tokens_stats["splits"]["test"]  # the same frozen split as finetuned_model
    assert meta["macro_f1"].value == pytest.approx(info["test"]["macro_f1"])
    assert meta["macro_f1"].value > meta["majority_macro_f1"].value + 0.15
    assert "confusion_matrix_chart" in meta and "| Mixed |" in meta["f1_per_class"].value
    # its own MLflow run, in the fine-tuned runs' experiment
    from mlflow import MlflowClient

    client = MlflowClient(MlflowResource().resolve_tracking_uri(deployment.store))
    run = client.get_run(info["mlflow_run_id"])
    assert run.data.tags["model_kind"] == "baseline" and run.data.tags["dataset_version"] == "en"
    assert run.data.metrics["test_macro_f1"] == pytest.approx(info["test"]["macro_f1"])


def test_vocabulary_fit_passes_on_english_and_warns_on_arabic(deployment):
    english = _check(deployment.results["en"], "vocabulary_fit")
    assert english.passed and english.metadata["single_char_share"].value < 0.02
    if "ar" not in deployment.results:
        pytest.skip("shared/data/arabic_reviews is not available")
    arabic = _check(deployment.results["ar"], "vocabulary_fit")
    assert not arabic.passed and arabic.severity == dg.AssetCheckSeverity.WARN
    assert arabic.metadata["single_char_share"].value > 0.5
    assert "pretrained_model" in arabic.description and "hub id" in arabic.description
    assert deployment.results["ar"].success  # a warning: the run went on (baseline_model materialized)
    assert deployment.store.current("baseline_model", "ar") is not None


class _NoChampion:
    """MLflow client double: a registry where no version holds the alias (the only call the condition makes)."""

    def get_model_version_by_alias(self, name, alias):
        from mlflow.exceptions import MlflowException

        raise MlflowException(f"no alias {alias} on {name}")


def test_gate_refuses_a_challenger_below_its_own_baseline(deployment):
    baseline = read_baseline_info(deployment.store, "en")["test"]["macro_f1"]
    test_set = type("T", (), {"fingerprint": "x"})()
    meta: dict = {}
    refused = _baseline_condition(_NoChampion(), "m", test_set, deployment.store, "en", baseline - 0.01,
                                  QualityGateConfig(), meta)
    assert refused is not None and not refused.passed and refused.severity == dg.AssetCheckSeverity.ERROR
    assert refused.description.startswith("refused: macro-F1") and "does not beat" in refused.description
    table = refused.metadata["scores"].value
    assert "| challenger |" in table and "| baseline_model[en]" in table and "| champion | none |" in table
    assert refused.metadata["baseline_macro_f1"].value == pytest.approx(baseline)
    meta = {}
    assert _baseline_condition(_NoChampion(), "m", test_set, deployment.store, "en", baseline + 0.01,
                               QualityGateConfig(), meta) is None
    assert "beats" in meta["baseline_decision"]
    assert _baseline_condition(_NoChampion(), "m", test_set, deployment.store, "en", baseline + 0.01,
                               QualityGateConfig(baseline_margin=0.05), {}) is not None  # the margin counts
    meta = {}
    assert _baseline_condition(_NoChampion(), "m", test_set, deployment.store, "nope", 0.0,
                               QualityGateConfig(), meta) is None
    assert "not materialized" in meta["baseline_decision"]


def _cli(capsys, root: Path, *argv) -> tuple[int, str, str]:
    code = main(["--root", str(root), *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def labelled_files(tmp_path_factory) -> dict[str, Path]:
    """Real reviews as a user's labelled files: 1-5 stars (needs a mapping), and a spam/ham set (no mapping fits)."""
    out = tmp_path_factory.mktemp("labelled")
    table = read_default_reviews().slice(0, 120)
    stars = pa.table({"review": table.column("text"), "stars": table.column("rating").cast(pa.string())})
    pacsv.write_csv(stars, out / "stars.csv")
    spam = pa.table({"text": table.column("text").slice(0, 20), "label": ["spam", "ham"] * 10})
    pacsv.write_csv(spam, out / "spam.csv")
    return {"stars": out / "stars.csv", "spam": out / "spam.csv"}


def test_evaluate_prints_scores_and_refuses_foreign_labels(deployment, labelled_files, capsys):
    root = deployment.root
    code, out, err = _cli(capsys, root, "evaluate", "--version", "en", "--baseline", "--file",
                          str(labelled_files["stars"]), "--label-column", "stars", "--label-mapping", STARS)
    assert code == 0, err
    assert "accuracy" in out and "macro-F1" in out and "confusion matrix" in out and "Mixed" in out
    code, out, err = _cli(capsys, root, "evaluate", "--model", str(deployment.model_dir), "--json", "--file",
                          str(labelled_files["stars"]), "--label-column", "stars", "--label-mapping", STARS)
    assert code == 0, err
    result = json.loads(out)
    assert result["samples"] == 120 and sum(map(sum, result["confusion_matrix"])) == 120
    assert set(result["f1_per_class"]) == {"Positive", "Negative", "Mixed"}
    # without the mapping, stars 2..5 are labels the model cannot predict ("1" maps to Positive by default)
    code, _, err = _cli(capsys, root, "evaluate", "--version", "en", "--baseline", "--file",
                        str(labelled_files["stars"]), "--label-column", "stars")
    assert code == 2 and "do not match the model's label set" in err and "'5'" in err
    code, _, err = _cli(capsys, root, "evaluate", "--version", "en", "--baseline", "--file", str(labelled_files["spam"]))
    assert code == 2 and "'spam'" in err and "--label-mapping" in err
    holes = labelled_files["stars"].with_name("holes.csv")
    holes.write_text('review,stars\n"fits well",5\n"",4\n"too big",\n', encoding="utf-8")
    code, _, err = _cli(capsys, root, "evaluate", "--version", "en", "--baseline", "--file", str(holes),
                        "--label-column", "stars", "--label-mapping", STARS)
    assert code == 2 and "2 unusable rows" in err and "row 1: empty" in err and "row 2: no label" in err


def test_benchmark_sets_score_every_model_and_refuse_foreign_label_sets(deployment, labelled_files, capsys):
    root, store = deployment.root, deployment.store
    assert _cli(capsys, root, "benchmarks", "add", "stars", "--source", str(labelled_files["stars"]),
                "--label-column", "stars", "--label-mapping", STARS)[0] == 0
    code, out, err = _cli(capsys, root, "benchmarks", "add", "spam", "--source", str(labelled_files["spam"]))
    assert code == 0, err  # registering is allowed: a model with spam/ham labels could be scored on it
    code, out, _ = _cli(capsys, root, "benchmarks", "list", "--json")
    assert [json.loads(line)["name"] for line in out.splitlines()] == ["spam", "stars"]
    # Stand-in for a trained finetuned_model[en]: the untrained tiny BERT published where the trainer publishes.
    with store.publish("finetuned_model", "en") as staging:
        shutil.copytree(deployment.model_dir, staging.local_dir / "model")
        staging.data_version = hash_tree(staging.local_dir)
    result = deployment.materialize("en", dg.AssetSelection.assets("benchmark_scores"))
    assert result.success
    scores = store.read_json(f"{store.require('benchmark_scores', 'en').url}/scores.json")
    assert scores["stars"]["rows"] == 120 and 0 <= scores["stars"]["finetuned"]["accuracy"] <= 1
    assert scores["stars"]["baseline"]["macro_f1"] > 0
    assert "refused" in scores["spam"]["finetuned"] and "refused" in scores["spam"]["baseline"]
    (mat,) = result.asset_materializations_for_node("benchmark_scores")
    table = mat.metadata["across_versions"].value
    assert "| en | stars | 120 |" in table and "refused: labels do not match" in table


def test_summary_reads_what_was_published(deployment, capsys):
    code, out, err = _cli(capsys, deployment.root, "summary", "en")
    assert code == 0, err
    assert out.startswith("dataset version en: 3000 reviews (0 rejected)")
    info = read_baseline_info(deployment.store, "en")
    assert f"{info['test']['accuracy']:.4f}" in out and "baseline (TF-IDF+LR)" in out
    assert "champion:" in out
    code, _, err = _cli(capsys, deployment.root, "summary", "missing")
    assert code == 2 and "no materialized raw_reviews" in err
