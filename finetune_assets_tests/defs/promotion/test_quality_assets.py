"""baseline_model, vocabulary_fit, the gate's baseline condition, benchmark sets, evaluate and
summary, with the tiny BERT as base model: version "en" is the project's generated English sample
(builtin:sample), version "ar" and the user's labelled files are real reviews (the shared Arabic
PROD.csv).

One deployment is built per module (base model, two versions, their baselines) and shared by the
tests: materializing is the slow part, the assertions are cheap.
"""

import json
import shutil
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from finetune_assets.cli import main
from finetune_assets.core.evaluation import gate_rules as gate
from finetune_assets.core.io.storage import Storage, hash_tree
from finetune_assets.core.prep.validate import ValidationRules, validate
from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets.core.sources.sample import SAMPLE_SOURCE
from finetune_assets.defs.benchmarks.scores import benchmark_scores
from finetune_assets.defs.data.pretrained import pretrained_model
from finetune_assets.defs.data.raw import raw_reviews
from finetune_assets.defs.data.tokenized import tokenized_reviews
from finetune_assets.defs.data.vocab_check import vocabulary_fit
from finetune_assets.defs.models.baseline_model import baseline_model, read_baseline_info
from finetune_assets.defs.promotion.gate_check import (
    QualityGateConfig,
    _side_by_side,
    frozen_test_set,
    gate_conditions,
)
from finetune_assets.defs.resources.launchers import LocalTorchrunLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets.defs.versions.register import write_version

ASSETS = [
    raw_reviews,
    pretrained_model,
    tokenized_reviews,
    baseline_model,
    benchmark_scores,
    vocabulary_fit,
]
STARS = '{"1": "Negative", "2": "Negative", "3": "Mixed", "4": "Positive", "5": "Positive"}'


class Deployment:
    def __init__(self, root: Path, instance, model_dir: Path):
        self.root, self.instance, self.model_dir = root, instance, model_dir
        self.store = Storage(str(root))
        self.resources = {
            "storage": StorageResource(root=str(root)),
            "mlflow": MlflowResource(),
            "launcher": LocalTorchrunLauncher(),
        }

    def materialize(
        self, version: str | None, selection, run_config=None
    ) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            ASSETS,
            selection=selection,
            partition_key=version,
            instance=self.instance,
            resources=self.resources,
            run_config=run_config,
            raise_on_error=False,
        )

    def add_version(self, version: str, source: str) -> dg.ExecuteInProcessResult:
        write_version(self.store, version, SourceSpec(uri=source))
        self.instance.add_dynamic_partitions(DATASET_VERSIONS, [version])
        selection = dg.AssetSelection.assets(
            "raw_reviews", "tokenized_reviews", "baseline_model"
        ).without_checks() | dg.AssetSelection.checks_for_assets(tokenized_reviews)
        return self.materialize(version, selection)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, _tiny_model_session):
    tmp = tmp_path_factory.mktemp("quality")
    (tmp / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp / "home")) as instance:
        d = Deployment(tmp / "storage", instance, _tiny_model_session)
        assert d.materialize(
            None,
            dg.AssetSelection.assets("pretrained_model"),
            dg.RunConfig(ops={"pretrained_model": {"config": {"source": str(d.model_dir)}}}),
        ).success
        d.results = {"en": d.add_version("en", SAMPLE_SOURCE)}
        shared = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "arabic_reviews"
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
    assert info["rows"] == {
        "train": meta["train_reviews"].value,
        "test": meta["test_samples"].value,
    }
    tokens_stats = deployment.store.read_json(
        f"{deployment.store.require('tokenized_reviews', 'en').url}/stats.json"
    )
    # the same frozen split as finetuned_model
    assert info["rows"]["test"] == tokens_stats["splits"]["test"]
    assert meta["macro_f1"].value == pytest.approx(info["test"]["macro_f1"])
    assert meta["macro_f1"].value > meta["majority_macro_f1"].value + 0.15
    assert "confusion_matrix_chart" in meta and "| Mixed |" in meta["f1_per_class"].value
    # real reviews: the baseline is well above the majority class there too
    if "ar" in deployment.results:
        arabic = read_baseline_info(deployment.store, "ar")
        assert arabic["test"]["macro_f1"] > arabic["majority"]["macro_f1"] + 0.15
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
    assert deployment.results[
        "ar"
    ].success  # a warning: the run went on (baseline_model materialized)
    assert deployment.store.current("baseline_model", "ar") is not None


def _gate(deployment, version: str, score: float, config: QualityGateConfig):
    """The gate's conditions for a challenger scoring ``score`` on version ``version``, with no
    champion (the test texts are en's: only their majority class enters the floor, and the default
    floor is 0).
    """
    test = frozen_test_set(deployment.store, "en")
    conditions, about = gate_conditions(config, test, deployment.store, version)
    base = gate.Comparison(gate.Challenger("m", "1", score), None, None, test)
    refusals = tuple(r for cond in conditions if (r := cond(base)) is not None)
    result = gate.Comparison(base.challenger, None, None, test, refusals)
    return result, about, _side_by_side(version, score, about, result)


def test_gate_refuses_a_challenger_below_its_own_baseline(deployment):
    baseline = read_baseline_info(deployment.store, "en")["test"]["macro_f1"]
    refused, about, meta = _gate(deployment, "en", baseline - 0.01, QualityGateConfig())
    assert about["baseline_macro_f1"] == pytest.approx(baseline) and about["baseline_margin"] == 0.0
    assert (
        not refused.promotable
        and len(refused.refusals) == 1
        and "does not beat" in refused.refusals[0]
    )
    assert gate.describe(refused).startswith(
        f"refused: macro-F1 {baseline - 0.01:.4f} does not beat the baseline's"
    )
    table = meta["scores"].value
    assert f"| challenger | {baseline - 0.01:.4f} |" in table and "| champion | none |" in table
    assert f"| baseline_model[en] + margin 0.0000 | {baseline:.4f} |" in table
    assert meta["baseline_macro_f1"].value == pytest.approx(baseline)

    above, _, _ = _gate(deployment, "en", baseline + 0.01, QualityGateConfig())
    assert above.promotable and gate.describe(above).startswith("promoted: first model")
    margin, _, meta = _gate(
        deployment, "en", baseline + 0.01, QualityGateConfig(baseline_margin=0.05)
    )
    # the margin counts
    assert not margin.promotable and f"needs >= {baseline + 0.05:.4f}" in margin.refusals[0]
    assert "| baseline_model[en] + margin 0.0500 |" in meta["scores"].value

    # No baseline: refused (the rule cannot be checked), said in the decision and the table.
    missing, about, meta = _gate(deployment, "nope", 0.99, QualityGateConfig())
    assert (
        not missing.promotable and "baseline_model[nope] is not materialized" in missing.refusals[0]
    )
    assert (
        "not materialized" in about["baseline_decision"]
        and "not materialized" in meta["baseline_decision"]
    )
    assert "baseline_macro_f1" not in meta and "not materialized" in meta["scores"].value
    off, about, _ = _gate(deployment, "en", 0.99, QualityGateConfig(baseline_margin=None))
    assert off.promotable and about["baseline_decision"].startswith("off")


def _cli(capsys, root: Path, *argv) -> tuple[int, str, str]:
    code = main(["--root", str(root), *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def labelled_files(tmp_path_factory, arabic_reviews) -> dict[str, Path]:
    """Real reviews (PROD.csv) as a user's labelled files: 1-5 stars from their polarity (needs a
    mapping), and a spam/ham set (no mapping fits).
    """
    out = tmp_path_factory.mktemp("labelled")
    table = read_source(SourceSpec(uri=str(arabic_reviews / "PROD.csv"))).slice(0, 120)
    # both star values of a class occur
    to_stars = {
        "1": ("4", "5"),
        "0": ("3", "3"),
        "-1": ("1", "2"),
    }
    stars = [to_stars[lab][i % 2] for i, lab in enumerate(table.column("label").to_pylist())]
    stars = pa.table({"review": table.column("text"), "stars": stars})
    pacsv.write_csv(stars, out / "stars.csv")
    spam = pa.table({"text": table.column("text").slice(0, 20), "label": ["spam", "ham"] * 10})
    pacsv.write_csv(spam, out / "spam.csv")
    return {"stars": out / "stars.csv", "spam": out / "spam.csv"}


def test_evaluate_prints_scores_and_refuses_foreign_labels(deployment, labelled_files, capsys):
    root = deployment.root
    code, out, err = _cli(
        capsys,
        root,
        "evaluate",
        "--version",
        "en",
        "--baseline",
        "--file",
        str(labelled_files["stars"]),
        "--label-column",
        "stars",
        "--label-mapping",
        STARS,
    )
    assert code == 0, err
    assert "accuracy" in out and "macro-F1" in out and "confusion matrix" in out and "Mixed" in out
    code, out, err = _cli(
        capsys,
        root,
        "evaluate",
        "--model",
        str(deployment.model_dir),
        "--json",
        "--file",
        str(labelled_files["stars"]),
        "--label-column",
        "stars",
        "--label-mapping",
        STARS,
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["samples"] == 120 and sum(map(sum, result["confusion_matrix"])) == 120
    assert set(result["f1_per_class"]) == {"Positive", "Negative", "Mixed"}
    # without the mapping, stars 2..5 are labels the model cannot predict ("1" maps to Positive by
    # default)
    code, _, err = _cli(
        capsys,
        root,
        "evaluate",
        "--version",
        "en",
        "--baseline",
        "--file",
        str(labelled_files["stars"]),
        "--label-column",
        "stars",
    )
    assert code == 2 and "do not match the model's label set" in err and "'5'" in err
    code, _, err = _cli(
        capsys,
        root,
        "evaluate",
        "--version",
        "en",
        "--baseline",
        "--file",
        str(labelled_files["spam"]),
    )
    assert code == 2 and "'spam'" in err and "--label-mapping" in err
    holes = labelled_files["stars"].with_name("holes.csv")
    holes.write_text('review,stars\n"fits well",5\n"",4\n"too big",\n', encoding="utf-8")
    code, _, err = _cli(
        capsys,
        root,
        "evaluate",
        "--version",
        "en",
        "--baseline",
        "--file",
        str(holes),
        "--label-column",
        "stars",
        "--label-mapping",
        STARS,
    )
    assert (
        code == 2
        and "2 unusable rows" in err
        and "row 1: empty" in err
        and "row 2: no label" in err
    )


def test_benchmark_sets_score_every_model_and_refuse_foreign_label_sets(
    deployment, labelled_files, capsys
):
    root, store = deployment.root, deployment.store
    assert (
        _cli(
            capsys,
            root,
            "benchmarks",
            "add",
            "stars",
            "--source",
            str(labelled_files["stars"]),
            "--label-column",
            "stars",
            "--label-mapping",
            STARS,
        )[0]
        == 0
    )
    code, out, err = _cli(
        capsys, root, "benchmarks", "add", "spam", "--source", str(labelled_files["spam"])
    )
    # registering is allowed: a model with spam/ham labels could be scored on it
    assert code == 0, err
    code, out, _ = _cli(capsys, root, "benchmarks", "list", "--json")
    assert [json.loads(line)["name"] for line in out.splitlines()] == ["spam", "stars"]
    # Stand-in for a trained finetuned_model[en]: the untrained tiny BERT published where the
    # trainer publishes.
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
    # duplicates are rejected
    sample = validate(read_source(SourceSpec(uri=SAMPLE_SOURCE)), ValidationRules())
    rows, rejected = sample.accepted.num_rows, sample.rejected.num_rows
    assert out.startswith(f"dataset version en: {rows} reviews ({rejected} rejected)")
    info = read_baseline_info(deployment.store, "en")
    assert f"{info['test']['accuracy']:.4f}" in out and "baseline (TF-IDF+LR)" in out
    assert "champion:" in out
    code, _, err = _cli(capsys, deployment.root, "summary", "missing")
    assert code == 2 and "no materialized raw_reviews" in err
