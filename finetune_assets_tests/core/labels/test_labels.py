"""Label sets per dataset version: inference rules, explicit flags, refusals, and what is
recorded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from finetune_assets.core.labels.infer import (
    DEFAULT_LABEL_SET,
    STARS_LABEL_SET,
    LabelError,
    LabelSet,
    infer_label_set,
    parse_labels_flag,
    parse_mapping_flag,
    registered_model_name,
    resolve_label_set,
)
from finetune_assets.core.prep.validate import ValidationRules, validate
from finetune_assets_tests.cli.test_cli import run_cli

# The files a user brings (``binary_reviews_tsv``, ``star_reviews_csv`` in conftest.py) are written
# from the shared real Arabic reviews: those tests skip where the shared data is absent.


# -- inference -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values, names",
    [
        # the seed's numeric polarity
        (
            ["1", "-1", "0", "1.0", "-1.0"],
            ("Positive", "Negative", "Mixed"),
        ),
        (["5", "3", "4", "1", "2", "5.0"], STARS_LABEL_SET.names),
        ([" positive", "NEGATIVE", "Neutral ", "negative"], ("Negative", "Neutral", "Positive")),
        (["Very Positive", "mixed", "very negative"], ("Very negative", "Mixed", "Very positive")),
        # unknown names: sorted, first spelling
        (
            ["spam", "ham ", "Ham", "eggs"],
            ("eggs", "ham", "spam"),
        ),
    ],
)
def test_inferred_label_sets(values, names):
    assert infer_label_set(values).names == names


def test_the_seeds_numbers_keep_todays_mapping():
    assert infer_label_set(["1", "-1", "0"]) == DEFAULT_LABEL_SET
    assert [
        DEFAULT_LABEL_SET.map(v) for v in ("1", "1.0", "-1", "0", " Positive ", "neutral", "7")
    ] == ["Positive", "Positive", "Negative", "Mixed", "Positive", "Mixed", None]


@pytest.mark.parametrize(
    "values, shown",
    [
        (["0", "1", "1", "0"], "['0', '1']"),
        (["1", "2"], "['1', '2']"),
        (["0", "1", "2"], "['0', '1', '2']"),
        (["1", "good"], "['1', 'good']"),
    ],
)
def test_ambiguous_labels_are_refused_with_the_values_and_the_flag(values, shown):
    with pytest.raises(LabelError) as info:
        infer_label_set(values)
    message = str(info.value)
    assert (
        "ambiguous" in message
        and shown in message
        and "--label-mapping" in message
        and "--labels" in message
    )


def test_zero_one_refusal_names_the_exact_flags():
    with pytest.raises(
        LabelError, match=r"--labels Negative,Positive --label-mapping 0=Negative,1=Positive"
    ):
        infer_label_set(["0", "1"])


def test_explicit_labels_and_mapping():
    labels = resolve_label_set(
        ["0", "1", "0"],
        parse_labels_flag("Negative, Positive"),
        parse_mapping_flag("0=Negative,1=Positive"),
    )
    assert labels.names == ("Negative", "Positive") and labels.map("1.0") == "Positive"
    assert labels.id2label == {0: "Negative", 1: "Positive"}
    # a mapping alone: its names, known sentiment names in polarity order
    three = resolve_label_set(list("12345"), mapping=parse_mapping_flag("stars-to-sentiment"))
    assert three.names == ("Negative", "Neutral", "Positive")
    assert [three.map(v) for v in "12345"] == [
        "Negative",
        "Negative",
        "Neutral",
        "Positive",
        "Positive",
    ]


@pytest.mark.parametrize(
    "labels, mapping, error",
    [
        (
            "Negative,Positive,Mixed",
            "0=Negative,1=Positive",
            r"no review in the source has the class \['Mixed'\]",
        ),
        (
            "Negative,Positive",
            "0=Negative,1=Good",
            r"maps to \['Good'\], which are not among the labels",
        ),
        ("Negative", "0=Negative", r"at least two classes"),
        ("Bad,bad", None, r"ambiguous class names: \[.Bad., .bad.\] are one class"),
        (None, "0Negative", r"is not RAW=NAME"),
    ],
)
def test_unusable_label_sets_are_clear_errors(labels, mapping, error):
    with pytest.raises(LabelError, match=error):
        resolve_label_set(
            ["0", "1"],
            parse_labels_flag(labels) if labels else None,
            parse_mapping_flag(mapping) if mapping else None,
        )


def test_validation_follows_the_label_set():
    raw = pa.table(
        {
            "text": ["good", "bad", "meh", "odd"],
            "label": ["1", "0", "1.0", "7"],
            "source_file": ["f"] * 4,
            "source_row": list(range(4)),
            "malformed": [None] * 4,
        }
    )
    labels = LabelSet(("Negative", "Positive"), {"0": "Negative", "1": "Positive"})
    result = validate(raw, ValidationRules(labels=labels))
    assert result.accepted.column("label").to_pylist() == ["Positive", "Negative", "Positive"]
    assert result.label_counts == {"Negative": 1, "Positive": 2}
    assert result.reasons == {"unknown_label": 1}


def test_registered_model_name_is_one_per_set_of_classes():
    assert registered_model_name("review-classifier", DEFAULT_LABEL_SET) == "review-classifier"
    binary = LabelSet(("Negative", "Positive"))
    assert registered_model_name("rc", binary) == "rc-negative-positive"
    # by name
    assert registered_model_name("rc", LabelSet(("Positive", "Negative"))) == "rc-negative-positive"
    assert (
        registered_model_name("rc", STARS_LABEL_SET) == "rc-1_star-2_stars-3_stars-4_stars-5_stars"
    )
    odd = {
        registered_model_name("rc", LabelSet(n)) for n in (("a_b", "c"), ("a b", "c"), ("a-b", "c"))
    }
    assert len(odd) == 3  # slugs that could collide carry a hash


# -- registration (CLI) ----------------------------------------------------------------------------


@pytest.fixture
def dagster_home(tmp_path: Path, monkeypatch) -> Path:
    home = tmp_path / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def _partitions() -> list[str]:
    import dagster as dg

    from finetune_assets.cli.common import open_instance as _instance
    from finetune_assets.defs.versions.partitions import DATASET_VERSIONS

    _instance()
    return list(dg.DagsterInstance.get().get_dynamic_partitions(DATASET_VERSIONS))


def test_versions_add_refuses_ambiguous_labels_and_writes_nothing(
    capsys, dagster_home, storage_root, binary_reviews_tsv
):
    code, _, err = run_cli(
        capsys,
        "--root",
        str(storage_root),
        "versions",
        "add",
        "binary",
        "--source",
        str(binary_reviews_tsv),
    )
    assert code == 2
    assert (
        "['0', '1']" in err
        and "--labels Negative,Positive --label-mapping 0=Negative,1=Positive" in err
    )
    assert not (storage_root / "versions" / "binary.json").exists()
    assert "binary" not in _partitions()


def test_versions_add_records_labels_and_refuses_a_change(
    capsys, dagster_home, storage_root, binary_reviews_tsv
):
    root = ("--root", str(storage_root))
    flags = ("--labels", "Negative,Positive", "--label-mapping", "0=Negative,1=Positive")
    code, out, err = run_cli(
        capsys, *root, "versions", "add", "binary", "--source", str(binary_reviews_tsv), *flags
    )
    assert code == 0, err
    assert "labels: Negative, Positive" in out
    record = json.loads((storage_root / "versions" / "binary.json").read_text())
    assert record["labels"] == {
        "names": ["Negative", "Positive"],
        "mapping": {"0": "Negative", "1": "Positive"},
    }
    assert json.loads(run_cli(capsys, *root, "versions", "list", "--json")[1])["labels"] == [
        "Negative",
        "Positive",
    ]
    same = run_cli(
        capsys, *root, "versions", "add", "binary", "--source", str(binary_reviews_tsv), *flags
    )
    assert same[0] == 0  # the same labels again: ok
    before = (storage_root / "versions" / "binary.json").read_bytes()
    code, _, err = run_cli(
        capsys,
        *root,
        "versions",
        "add",
        "binary",
        "--source",
        str(binary_reviews_tsv),
        "--labels",
        "Positive,Negative",
        "--label-mapping",
        "1=Positive,0=Negative",
    )
    assert code == 2 and "cannot change" in err and "register a new version key" in err
    assert (storage_root / "versions" / "binary.json").read_bytes() == before


def test_versions_add_stars_five_classes_or_three_with_one_flag(
    capsys, dagster_home, storage_root, star_reviews_csv
):
    root = ("--root", str(storage_root))
    code, out, err = run_cli(
        capsys, *root, "versions", "add", "stars", "--source", str(star_reviews_csv)
    )
    assert code == 0, err
    assert json.loads((storage_root / "versions" / "stars.json").read_text())["labels"][
        "names"
    ] == list(STARS_LABEL_SET.names)
    code, out, err = run_cli(
        capsys,
        *root,
        "versions",
        "add",
        "stars3",
        "--source",
        str(star_reviews_csv),
        "--label-mapping",
        "stars-to-sentiment",
    )
    assert code == 0, err
    assert json.loads((storage_root / "versions" / "stars3.json").read_text())["labels"][
        "names"
    ] == ["Negative", "Neutral", "Positive"]


def test_versions_add_refuses_a_class_without_reviews(
    capsys, dagster_home, storage_root, binary_reviews_tsv
):
    code, _, err = run_cli(
        capsys,
        "--root",
        str(storage_root),
        "versions",
        "add",
        "binary",
        "--source",
        str(binary_reviews_tsv),
        "--labels",
        "Negative,Positive,Mixed",
        "--label-mapping",
        "0=Negative,1=Positive",
    )
    assert code == 2 and "no review in the source has the class ['Mixed']" in err
    assert not (storage_root / "versions" / "binary.json").exists()


# -- landing drops ---------------------------------------------------------------------------------


def test_a_landing_folder_carries_its_labels_in_a_manifest(
    instance, storage_root, tmp_path, binary_reviews_tsv
):
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.defs.versions.register import read_version
    from finetune_assets_tests.defs.versions.test_sensors import Daemon, _folder, _publish_base

    landing = tmp_path / "landing"
    _publish_base(storage_root)
    daemon = Daemon(instance, landing, storage_root)
    good = _folder(landing, "binary", [binary_reviews_tsv])
    (good / "_labels.json").write_text(
        json.dumps(
            {
                "labels": ["Negative", "Positive"],
                "label_mapping": {"0": "Negative", "1": "Positive"},
            }
        )
    )
    bad = _folder(landing, "typo", [binary_reviews_tsv])
    (bad / "_labels.json").write_text(
        json.dumps({"labels": ["Negative", "Positive"], "label_mapping": {"0": "Negtive"}})
    )
    added, _, _ = daemon.tick()
    assert added == ["binary"]
    record = read_version(Storage(str(storage_root)), "binary")
    assert record.label_set == LabelSet(
        ("Negative", "Positive"), {"0": "Negative", "1": "Positive"}
    )
    # refused with a reason, nothing written
    assert read_version(Storage(str(storage_root)), "typo") is None
    # other labels under the registered key are other content: refused, the record keeps its labels
    # re-landed as tools and editors save: a new file renamed over the old one. The sensor reads
    # only the landing listing for registered folders (the folder's own mtime), so an in-place
    # rewrite of a file inside a registered folder goes unseen; reported to the lead, not this
    # test's to settle.
    relanded = good / "_labels.json.tmp"
    relanded.write_text(
        json.dumps(
            {
                "labels": ["Positive", "Negative"],
                "label_mapping": {"1": "Positive", "0": "Negative"},
            }
        )
    )
    os.replace(relanded, good / "_labels.json")
    added, runs, skip = daemon.tick()
    assert added == [] and runs == [] and "binary" in skip and "content changed" in skip
    assert read_version(Storage(str(storage_root)), "binary").label_set.names == (
        "Negative",
        "Positive",
    )
