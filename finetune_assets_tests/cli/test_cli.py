"""The ``finetune-assets`` CLI as a user runs it: versions add / list / status and predict."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from finetune_assets.cli import main
from finetune_assets.cli.models import _normalize_model_uri
from finetune_assets.core.labels.infer import LABELS


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch) -> Path:
    home = tmp_path / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def test_import_stays_light():
    """`finetune-assets --help` must not pay for Dagster, torch, transformers or MLflow."""
    code = (
        "import sys, finetune_assets.cli; "
        "print(sorted(m for m in ('dagster', 'torch', 'transformers', 'mlflow', 'matplotlib') if "
        "m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# -- predict -----------------------------------------------------------------------------------


def test_predict_texts_from_args(capsys, tiny_model_dir):
    code, out, err = run_cli(
        capsys,
        "predict",
        "--model",
        str(tiny_model_dir),
        "--format",
        "tsv",
        "a fine product",
        "منتج سيء",
    )
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2
    for line, text in zip(lines, ("a fine product", "منتج سيء")):
        label, score, echoed = line.split("\t")
        assert label in LABELS
        assert 1 / len(LABELS) <= float(score) <= 1.0  # the argmax of a softmax
        assert echoed == text


def test_predict_json_scores_are_a_distribution(capsys, tiny_model_dir):
    code, out, _ = run_cli(capsys, "predict", "--model", str(tiny_model_dir), "--json", "good")
    assert code == 0
    row = json.loads(out)
    assert set(row["scores"]) == set(LABELS)
    assert sum(row["scores"].values()) == pytest.approx(1.0, abs=1e-4)
    assert row["label"] == max(row["scores"], key=row["scores"].get)
    assert row["score"] == row["scores"][row["label"]]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".txt", ".tsv"])
def test_predict_file_in_batches_keeps_order(capsys, tmp_path, tiny_model_dir, suffix):
    texts = [f"review number {i}" for i in range(7)]
    path = tmp_path / f"reviews{suffix}"
    if suffix == ".csv":
        path.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))
    elif suffix == ".tsv":
        path.write_text("text\tid\n" + "".join(f"{t}\t{i}\n" for i, t in enumerate(texts)))
    elif suffix == ".jsonl":
        path.write_text(
            "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts))
        )
    else:
        # blank lines skipped
        path.write_text("\n".join(texts[:3]) + "\n\n" + "\n".join(texts[3:]) + "\n")
    code, out, err = run_cli(
        capsys,
        "predict",
        "--model",
        str(tiny_model_dir),
        "--file",
        str(path),
        "--batch-size",
        "3",
        "--json",
    )
    assert code == 0, err
    assert [json.loads(line)["text"] for line in out.splitlines()] == texts
    assert "7/7" in err  # the progress bar on stderr reached the end


def test_predict_batching_does_not_change_scores(capsys, tmp_path, tiny_model_dir):
    """Padding to the longest text in a batch must not move a text's score."""
    path = tmp_path / "in.txt"
    path.write_text(
        "short\na much longer review that needs many more word pieces than the first one\nok\n"
    )
    scores = []
    for batch in ("1", "3"):
        code, out, _ = run_cli(
            capsys,
            "predict",
            "--model",
            str(tiny_model_dir),
            "--file",
            str(path),
            "--batch-size",
            batch,
            "--json",
            "--no-progress",
        )
        assert code == 0
        scores.append([json.loads(line)["score"] for line in out.splitlines()])
    assert scores[0] == pytest.approx(scores[1], abs=1e-5)


def test_predict_batches_by_length_and_answers_in_input_order(
    capsys, monkeypatch, tmp_path, tiny_model_dir
):
    """The model sees batches of similar length (little padding); each answer still lands on its
    own line.
    """
    from finetune_assets.core.evaluation.inference import Classifier

    rng = __import__("random").Random(0)
    texts = [f"r{i} " + "word " * rng.randrange(0, 40) for i in range(23)]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    seen: list[list[str]] = []
    real = Classifier.predict

    def spy(self, batch, max_length):
        seen.append(list(batch))
        return real(self, batch, max_length)

    monkeypatch.setattr(Classifier, "predict", spy)
    code, out, err = run_cli(
        capsys,
        "predict",
        "--model",
        str(tiny_model_dir),
        "--file",
        str(path),
        "--batch-size",
        "4",
        "--json",
        "--no-progress",
    )
    assert code == 0, err
    assert [json.loads(line)["text"] for line in out.splitlines()] == texts
    flat = [t for batch in seen for t in batch]
    assert sorted(flat) == sorted(texts) and [len(t) for t in flat] == sorted(
        map(len, texts), reverse=True
    )
    monkeypatch.setattr(Classifier, "predict", real)
    one_by_one = [real(Classifier.from_folder(tiny_model_dir), [t], 512)[0][1] for t in texts[:5]]
    assert [json.loads(line)["score"] for line in out.splitlines()[:5]] == pytest.approx(
        one_by_one, abs=1e-5
    )


def test_predict_reads_stdin(capsys, monkeypatch, tiny_model_dir):
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\n\nsecond\n"))
    code, out, err = run_cli(capsys, "predict", "--model", str(tiny_model_dir))
    assert code == 0
    # not a terminal: JSON lines by default; the blank line is a separator, and said so
    assert [json.loads(line)["text"] for line in out.splitlines()] == ["first", "second"]
    assert "1 blank line(s) skipped" in err


def test_predict_by_version_uses_the_published_attempt(capsys, storage_root, tiny_model_dir):
    from finetune_assets.core.io.storage import Storage

    store = Storage(str(storage_root))
    with store.publish("finetuned_model", "v1") as staging:
        shutil.copytree(tiny_model_dir, staging.local_dir / "model")
        staging.data_version = "test"
    code, out, err = run_cli(
        capsys, "--root", str(storage_root), "predict", "--version", "v1", "a sentence"
    )
    assert code == 0, err
    assert json.loads(out)["label"] in LABELS


def test_predict_unknown_version_says_so(capsys, storage_root):
    code, out, err = run_cli(
        capsys, "--root", str(storage_root), "predict", "--version", "nope", "text"
    )
    assert code == 2 and out == ""
    assert "no trained model for dataset version 'nope'" in err
    assert "not registered" in err


def test_predict_registered_but_untrained_version_says_how_to_train(capsys, storage_root):
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.core.sources import SourceSpec
    from finetune_assets.defs.versions.register import write_version

    write_version(Storage(str(storage_root)), "v2", SourceSpec(uri="builtin:sample"))
    code, _, err = run_cli(
        capsys, "--root", str(storage_root), "predict", "--version", "v2", "text"
    )
    assert code == 2
    assert "has not been materialized" in err and "--partition v2" in err


def test_predict_missing_or_wrong_model_folder(capsys, tmp_path):
    code, _, err = run_cli(capsys, "predict", "--model", str(tmp_path / "absent"), "x")
    assert code == 2 and "does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "predict", "--model", str(tmp_path / "empty"), "x")
    assert code == 2 and "no config.json" in err


def test_predict_needs_exactly_one_model(capsys, tiny_model_dir):
    code, _, err = run_cli(capsys, "predict", "x")
    assert code == 2 and "exactly one of" in err
    code, _, err = run_cli(
        capsys, "predict", "--model", str(tiny_model_dir), "--version", "v1", "x"
    )
    assert code == 2 and "exactly one of" in err


def test_predict_csv_without_text_column_names_the_columns(capsys, tmp_path, tiny_model_dir):
    path = tmp_path / "in.csv"
    path.write_text("opinion,grade\nnice,5\n")
    code, _, err = run_cli(capsys, "predict", "--model", str(tiny_model_dir), "--file", str(path))
    assert code == 2 and "['opinion', 'grade']" in err and "--text-column" in err
    code, out, _ = run_cli(
        capsys,
        "predict",
        "--model",
        str(tiny_model_dir),
        "--file",
        str(path),
        "--text-column",
        "grade",
        "--no-progress",
        "--format",
        "tsv",
    )
    assert code == 0 and out.endswith("\t5\n")


def test_model_uri_aliases():
    assert (
        _normalize_model_uri("models:/review-classifier/champion")
        == "models:/review-classifier@champion"
    )
    assert _normalize_model_uri("models:/review-classifier/3") == "models:/review-classifier/3"
    assert (
        _normalize_model_uri("models:/review-classifier/latest")
        == "models:/review-classifier/latest"
    )
    assert (
        _normalize_model_uri("models:/review-classifier@champion")
        == "models:/review-classifier@champion"
    )
    assert _normalize_model_uri("runs:/abc/model") == "runs:/abc/model"


@pytest.mark.slow
def test_predict_from_mlflow_registry(capsys, tmp_path, storage_root, tiny_model_dir, monkeypatch):
    """A model registered in the embedded store under the storage root loads by version and by
    alias.
    """
    import mlflow
    import transformers

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{storage_root}/mlflow/mlflow.db"
    (storage_root / "mlflow").mkdir()
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment(
        "cli-test", artifact_location=str(storage_root / "mlflow" / "artifacts")
    )
    pipe = transformers.pipeline(
        "text-classification", model=str(tiny_model_dir), tokenizer=str(tiny_model_dir)
    )
    with mlflow.start_run(experiment_id=exp):
        mlflow.transformers.log_model(
            pipe,
            name="model",
            task="text-classification",
            registered_model_name="review-classifier",
        )
    mlflow.MlflowClient().set_registered_model_alias("review-classifier", "champion", "1")
    expected = None
    for ref in ("models:/review-classifier/1", "models:/review-classifier/champion"):
        code, out, err = run_cli(
            capsys, "--root", str(storage_root), "predict", "--model-uri", ref, "--json", "ok"
        )
        assert code == 0, err
        row = json.loads(out)
        assert row["label"] in LABELS
        expected = expected or row["scores"]
        assert row["scores"] == pytest.approx(expected)
    code, _, err = run_cli(
        capsys,
        "--root",
        str(storage_root),
        "predict",
        "--model-uri",
        "models:/review-classifier@nope",
        "ok",
    )
    assert code == 2 and "cannot load" in err


def test_predict_output_survives_any_text_and_reports_bad_rows(capsys, tmp_path, tiny_model_dir):
    """Multi-line, tab-holding, BOM-prefixed CSV input; empty and invisible-only texts are
    per-row errors.
    """
    path = tmp_path / "in.csv"
    texts = ["line one\nline two", "tab\there", "\u200f\u200b", "", "fine"]
    import csv as _csv

    buf = io.StringIO()
    _csv.writer(buf).writerows([["text"], *[[t] for t in texts]])
    path.write_bytes(b"\xef\xbb\xbf" + buf.getvalue().encode())  # Excel's byte-order mark
    code, out, err = run_cli(
        capsys, "predict", "--model", str(tiny_model_dir), "--file", str(path), "--no-progress"
    )
    assert code == 1  # some rows could not be classified
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in rows] == texts  # one output row per input row, in order
    assert [("error" in r) for r in rows] == [False, False, True, True, False]
    # (review 1 spans 2-3)
    assert rows[2]["error"].startswith("empty_text") and rows[2]["where"] == f"{path}:5"
    assert f"{path}:6: empty_text" in err and "2 of 5 input row(s) could not be classified" in err
    code, out, _ = run_cli(
        capsys,
        "predict",
        "--model",
        str(tiny_model_dir),
        "--file",
        str(path),
        "--no-progress",
        "--format",
        "tsv",
    )
    lines = out.splitlines()
    assert len(lines) == 5 and all(line.count("\t") == 2 for line in lines)
    assert lines[0].endswith("\tline one\\nline two") and lines[1].endswith("\ttab\\there")
    assert lines[3] == "ERROR\t\t"


def test_predict_json_array_file_is_one_row_per_element(capsys, tmp_path, tiny_model_dir):
    path = tmp_path / "in.json"
    path.write_text(json.dumps(["first review", "second\nreview"]))
    code, out, err = run_cli(
        capsys, "predict", "--model", str(tiny_model_dir), "--file", str(path), "--no-progress"
    )
    assert code == 0, err
    assert [json.loads(line)["text"] for line in out.splitlines()] == [
        "first review",
        "second\nreview",
    ]


def test_predict_malformed_csv_row_is_an_error_naming_its_line(capsys, tmp_path, tiny_model_dir):
    path = tmp_path / "in.csv"
    path.write_text('text\nok one\n"unclosed\nok two\n')
    code, out, err = run_cli(
        capsys, "predict", "--model", str(tiny_model_dir), "--file", str(path), "--no-progress"
    )
    assert code == 1
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r.get("text") for r in rows] == ["ok one", None, "ok two"]
    assert rows[1]["where"] == f"{path}:3" and "never closed" in rows[1]["error"]


# -- versions ----------------------------------------------------------------------------------


def test_versions_add_list(capsys, dagster_home, storage_root):
    code, out, err = run_cli(
        capsys, "--root", str(storage_root), "versions", "add", "v1", "--source", "builtin:sample"
    )
    assert code == 0, err
    assert "registered dataset version v1" in out
    assert (storage_root / "versions" / "v1.json").is_file()
    assert (dagster_home / "dagster.yaml").is_file()
    code, out, _ = run_cli(capsys, "--root", str(storage_root), "versions", "list")
    assert code == 0 and out.startswith("v1\tbuiltin:sample\t")
    code, out, _ = run_cli(capsys, "--root", str(storage_root), "versions", "list", "--json")
    assert json.loads(out)["source"] == "builtin:sample"


def test_versions_add_rejects_bad_key(capsys, dagster_home, storage_root):
    code, _, err = run_cli(
        capsys, "--root", str(storage_root), "versions", "add", "../x", "--source", "builtin:sample"
    )
    assert code == 2 and "invalid dataset version key" in err


def test_versions_need_dagster_home(capsys, monkeypatch, storage_root):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    code, _, err = run_cli(capsys, "--root", str(storage_root), "versions", "list")
    assert code == 2 and "DAGSTER_HOME is not set" in err


def _report(
    instance,
    asset: str,
    partition: str | None,
    data_version: str,
    inputs: dict[str, int] | None = None,
    root: str = ".",
):
    """A materialization event as a run records it: data version, the code version of the code
    location (``build_defs``), and per input its event pointer and data version.
    """
    import dagster as dg

    from finetune_assets.definitions import build_defs

    code = build_defs(root).resolve_asset_graph().get(dg.AssetKey(asset)).code_version
    tags = {"dagster/data_version": data_version, "dagster/code_version": code}
    for upstream, storage_id in (inputs or {}).items():
        (used,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(upstream), storage_ids=[storage_id]),
            limit=1,
        ).records
        tags[f"dagster/input_event_pointer/{upstream}"] = str(storage_id)
        tags[f"dagster/input_data_version/{upstream}"] = used.asset_materialization.tags[
            "dagster/data_version"
        ]
    instance.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=asset, partition=partition, tags=tags)
    )
    key = dg.AssetKey(asset)
    flt = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]) if partition else key
    return instance.fetch_materializations(flt, limit=1).records[0].storage_id


def test_versions_status_materialized_stale_missing(capsys, dagster_home, storage_root):
    import dagster as dg

    assert (
        run_cli(
            capsys,
            "--root",
            str(storage_root),
            "versions",
            "add",
            "v1",
            "--source",
            "builtin:sample",
        )[0]
        == 0
    )
    instance = dg.DagsterInstance.get()
    raw = _report(instance, "raw_reviews", "v1", "aaa")
    pre = _report(instance, "pretrained_model", None, "ppp")
    _report(
        instance, "tokenized_reviews", "v1", "ttt", {"raw_reviews": raw, "pretrained_model": pre}
    )

    def status() -> dict[str, dict]:
        code, out, err = run_cli(capsys, "versions", "status", "--json")
        assert code == 0, err
        return {r["asset"]: r for r in map(json.loads, out.splitlines())}

    rows = status()
    assert (
        rows["raw_reviews"]["status"] == "materialized"
        and rows["raw_reviews"]["data_version"] == "aaa"
    )
    assert rows["tokenized_reviews"]["status"] == "materialized"
    assert rows["pretrained_model"]["version"] == "-"
    assert rows["mds_shards"]["status"] == rows["finetuned_model"]["status"] == "missing"

    _report(instance, "raw_reviews", "v1", "aaa")  # re-materialized, same content: not stale
    assert status()["tokenized_reviews"]["status"] == "materialized"
    _report(instance, "raw_reviews", "v1", "bbb")  # new content upstream
    row = status()["tokenized_reviews"]
    assert row["status"] == "stale" and row["stale_because"][0].startswith("raw_reviews: ")

    # the version's latest run failed: what it never materialized is "failed" (with the sensor's
    # tag), not "missing"
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus

    instance.add_run(
        DagsterRun(
            job_name="retrain_job",
            run_id="f" * 36,
            status=DagsterRunStatus.FAILURE,
            tags={"dagster/partition": "v1", "finetune_assets/version_status": "failed: 3 runs"},
        )
    )
    rows = status()
    assert rows["mds_shards"]["status"] == "failed" and rows["mds_shards"]["run_id"] == "f" * 36
    assert rows["mds_shards"]["detail"] == "failed: 3 runs"
    assert rows["raw_reviews"]["status"] == "materialized"  # what exists stays as it is

    code, out, _ = run_cli(capsys, "versions", "status", "v1")
    assert code == 0
    assert "stale (raw_reviews: " in out and "failed" in out
    code, _, err = run_cli(capsys, "versions", "status", "v9")
    assert code == 2 and "not registered: v9" in err


def test_versions_status_agrees_with_dagsters_stale_flags_after_a_default_change(
    capsys, dagster_home, storage_root, monkeypatch
):
    """A config default folded into a code version (defs/staleness.py): the UI marks the asset
    stale; so
    must ``versions status``, cell for cell, with Dagster's resolver (what the UI and GraphQL
    staleStatus use).
    """
    import dagster as dg
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    from finetune_assets.definitions import build_defs
    from finetune_assets.defs.data.tokenized import TokenizeConfig

    root = str(storage_root)
    assert (
        run_cli(capsys, "--root", root, "versions", "add", "v1", "--source", "builtin:sample")[0]
        == 0
    )
    instance = dg.DagsterInstance.get()
    raw = _report(instance, "raw_reviews", "v1", "aaa", root=root)
    pre = _report(instance, "pretrained_model", None, "ppp", root=root)
    _report(
        instance,
        "tokenized_reviews",
        "v1",
        "ttt",
        {"raw_reviews": raw, "pretrained_model": pre},
        root=root,
    )

    def cli_and_ui() -> tuple[dict, dict]:
        code, out, err = run_cli(capsys, "--root", root, "versions", "status", "v1", "--json")
        assert code == 0, err
        rows = {
            r["asset"]: r["status"]
            for r in map(json.loads, out.splitlines())
            if r["status"] != "missing"
        }
        # as the UI builds it
        resolver = CachingStaleStatusResolver(
            instance, build_defs(root).resolve_asset_graph(), LoadingContextForTest(instance)
        )
        ui = {
            a: "stale"
            if resolver.get_status(dg.AssetKey(a), None if a == "pretrained_model" else "v1")
            == StaleStatus.STALE
            else "materialized"
            for a in rows
        }
        return rows, ui

    cli, ui = cli_and_ui()
    assert cli == ui and cli["tokenized_reviews"] == "materialized"
    # a person edits a default
    monkeypatch.setattr(TokenizeConfig.model_fields["max_length"], "default", 256)
    cli, ui = cli_and_ui()
    assert (
        cli == ui and cli["tokenized_reviews"] == "stale" and cli["raw_reviews"] == "materialized"
    )


# -- registration that protects a key ------------------------------------------------------------


def _csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text,label\n" + "".join(f"{t},{lab}\n" for t, lab in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "source,expect",
    [
        ("missing.csv", "no such file or folder"),
        ("empty_dir", "folder holds no data files"),
        ("nolabel.csv", "no label column found"),
        ("broken.csv", "no row of the first"),
        ("notes.xlsx", "unsupported file type"),
    ],
)
def test_versions_add_validates_the_source_now(
    capsys, dagster_home, storage_root, tmp_path, source, expect
):
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "nolabel.csv").write_text("text\nfine\n")
    (tmp_path / "broken.csv").write_text('text,label\n"a,1\n"b,1\n')
    (tmp_path / "notes.xlsx").write_bytes(b"PK")
    code, out, err = run_cli(
        capsys,
        "--root",
        str(storage_root),
        "versions",
        "add",
        "v1",
        "--source",
        str(tmp_path / source),
    )
    assert (
        code == 2
        and expect in err
        and str(tmp_path / source) in err
        and "nothing registered" in err
    )
    assert not (storage_root / "versions" / "v1.json").exists()


def test_versions_add_refuses_another_source_under_a_key(
    capsys, dagster_home, storage_root, tmp_path, monkeypatch
):
    a = _csv(tmp_path / "a.csv", [("good", "1"), ("bad", "-1"), ("meh", "0")])
    b = _csv(tmp_path / "b.csv", [("great", "1"), ("awful", "-1"), ("so so", "0")])
    add = ("--root", str(storage_root), "versions", "add", "v1", "--source")
    assert run_cli(capsys, *add, str(a))[0] == 0
    assert run_cli(capsys, *add, str(a))[0] == 0  # the same source again: a no-op
    code, _, err = run_cli(capsys, *add, str(b))
    assert code == 2 and "registered from" in err and "--replace" in err
    code, _, err = run_cli(capsys, *add, str(b), "--replace")  # nothing materialized yet: allowed
    assert code == 0, err
    assert json.loads((storage_root / "versions" / "v1.json").read_text())["source"]["uri"] == str(
        b
    )
    # a relative path is recorded absolute, so the record works from anywhere
    monkeypatch.chdir(tmp_path)
    assert (
        run_cli(capsys, "--root", str(storage_root), "versions", "add", "v0", "--source", "a.csv")[
            0
        ]
        == 0
    )
    assert json.loads((storage_root / "versions" / "v0.json").read_text())["source"]["uri"] == str(
        a
    )

    import dagster as dg

    dg.DagsterInstance.get().report_runless_asset_event(
        dg.AssetMaterialization("raw_reviews", partition="v1")
    )
    code, _, err = run_cli(capsys, *add, str(a), "--replace")
    assert code == 2 and "raw_reviews already materialized" in err and "new key" in err
    # same path, new content, under a materialized key
    b.write_text("text,label\nchanged,1\nworse,-1\nokay,0\n")
    code, _, err = run_cli(capsys, *add, str(b))
    assert code == 2 and "changed since it was registered" in err


def test_concurrent_registrations_of_one_key_have_one_winner(storage_root, instance, tmp_path):
    import threading

    from finetune_assets.core.io.storage import Storage
    from finetune_assets.core.sources import SourceSpec
    from finetune_assets.defs.versions.register import (
        VersionConflict,
        read_version,
        register_version,
    )

    store = Storage(str(storage_root))
    sources = [
        _csv(tmp_path / f"s{i}.csv", [(f"review {i}", "1"), (f"bad {i}", "-1"), (f"meh {i}", "0")])
        for i in range(6)
    ]
    barrier = threading.Barrier(len(sources))
    outcome: dict[int, str] = {}

    def register(i: int) -> None:
        barrier.wait()
        try:
            register_version(instance, store, "v1", SourceSpec(uri=str(sources[i])))
            outcome[i] = "ok"
        except VersionConflict as err:
            outcome[i] = str(err)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(len(sources))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, o in outcome.items() if o == "ok"]
    assert len(winners) == 1, outcome
    assert read_version(store, "v1").source.uri == str(sources[winners[0]])
    # the lock is free again: a second registration of the winner's source goes through at once
    register_version(instance, store, "v1", SourceSpec(uri=str(sources[winners[0]])))


def test_versions_remove(capsys, dagster_home, storage_root, tmp_path):
    import dagster as dg

    a = _csv(tmp_path / "a.csv", [("good", "1"), ("bad", "-1"), ("meh", "0")])
    root = ("--root", str(storage_root))
    assert run_cli(capsys, *root, "versions", "add", "v1", "--source", str(a))[0] == 0
    assert run_cli(capsys, *root, "versions", "add", "v2", "--source", str(a))[0] == 0
    assert run_cli(capsys, *root, "versions", "remove", "v1")[0] == 0
    dg.DagsterInstance.get().report_runless_asset_event(
        dg.AssetMaterialization("raw_reviews", partition="v2")
    )
    code, _, err = run_cli(capsys, *root, "versions", "remove", "v2")
    assert code == 2 and "raw_reviews" in err and "--force" in err
    code, out, _ = run_cli(capsys, *root, "versions", "remove", "v2", "--force")
    assert code == 0
    code, out, _ = run_cli(capsys, *root, "versions", "list")
    assert out == "" and not list((storage_root / "versions").glob("*.json"))
    code, _, err = run_cli(capsys, *root, "versions", "remove", "v9")
    assert code == 2 and "not registered" in err


@pytest.mark.parametrize(
    "case",
    ["root_is_file", "root_parent_is_file", "home_is_file", "home_relative", "root_not_writable"],
)
def test_environment_mistakes_are_one_line_errors(capsys, monkeypatch, tmp_path, case):
    import os

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    root = tmp_path / "root"
    if case == "root_is_file":
        root.write_text("")
        expect = "is a file, not a folder"
    elif case == "root_parent_is_file":
        (tmp_path / "f").write_text("")
        root = tmp_path / "f" / "root"
        expect = "is a file, so the folder cannot be created"
    elif case == "home_is_file":
        (tmp_path / "home").write_text("")
        expect = "DAGSTER_HOME"
    elif case == "home_relative":
        monkeypatch.setenv("DAGSTER_HOME", "rel/home")
        expect = "is relative"
    else:
        if os.geteuid() == 0:
            pytest.skip("root ignores permissions")
        root.mkdir(mode=0o500)
        expect = "not writable"
    code, out, err = run_cli(
        capsys, "--root", str(root), "versions", "add", "v1", "--source", "builtin:sample"
    )
    assert code == 2 and expect in err and "Traceback" not in err and err.startswith("error: ")


def test_summary_says_which_epoch_was_kept_and_whether_early_stopping_fired():
    from finetune_assets.cli.summary import format_summary

    base = {
        "version": "v1",
        "rows": 10,
        "rejected": 0,
        "splits": None,
        "finetuned": {"accuracy": 0.9, "macro_f1": 0.9},
        "baseline": None,
        "majority": None,
        "champion": None,
        "gate_decision": None,
    }
    stopped = {
        "selected": "best",
        "best_epoch": 2,
        "best_val_macro_f1": 0.8512,
        "epochs_trained": 3,
        "early_stopped": True,
        "stopped_at_epoch": 3,
    }
    text = format_summary({**base, "model_selection": stopped})
    assert (
        "fine-tuned weights: best validation macro-F1 0.8512 at epoch 2; "
        "early stopping fired after epoch 3"
    ) in text
    ran_out = {**stopped, "early_stopped": False, "stopped_at_epoch": None}
    assert "at epoch 2; no early stopping" in format_summary({**base, "model_selection": ran_out})
    # a result written before model selection existed: no line, no error
    assert "fine-tuned weights" not in format_summary({**base, "model_selection": None})
