"""Label values as people write them: one class per meaning, missing markers never a class, -1/1
binary.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pyarrow as pa
import pytest

from finetune_assets.core.labels.infer import (
    BINARY_LABEL_SET,
    LabelError,
    LabelSet,
    infer_label_set,
    label_notes,
    parse_labels_flag,
    parse_mapping_flag,
    resolve_label_set,
)
from finetune_assets.core.labels.values import is_missing, label_key
from finetune_assets.core.prep.validate import ValidationRules, validate
from finetune_assets_tests.cli.test_cli import dagster_home, run_cli  # noqa: F401 - fixture
from finetune_assets_tests.conftest import SHARED_DATA

ATT = SHARED_DATA / "ATT.csv"  # real reviews labelled -1/1; a generated stand-in when absent
CAFE = unicodedata.normalize("NFC", "Café")
CAFE_DECOMPOSED = unicodedata.normalize("NFD", "Café")


@pytest.mark.parametrize(
    "spellings, key",
    [
        (
            [
                "neg",
                "NEG",
                "Negative",
                " negative ",
                "negative.",
                "«neg»",
                "-ve",
                "Négatif",
                "سلبي",
            ],
            "negative",
        ),
        (["pos", "Positive!", "POSITIVE", "+ve", "'positive'", "إيجابي"], "positive"),
        (["1", "1.0", "+1", "１", '"1"', "1."], "1"),
        (["-1", "-1.0", "'-1'", "-1."], "-1"),
        ([CAFE, CAFE_DECOMPOSED, "café", "\u200fCafé"], "café"),
    ],
)
def test_spellings_of_one_value_have_one_key(spellings, key):
    assert {label_key(s) for s in spellings} == {key}


@pytest.mark.parametrize(
    "marker",
    [
        "",
        "  ",
        "N/A",
        "n/a",
        "NA",
        "NaN",
        "nan",
        "null",
        "NULL",
        "None",
        "-",
        "?",
        "#N/A",
        "\\N",
        "<NA>",
        "(blank)",
        None,
    ],
)
def test_missing_markers_are_missing_and_real_values_are_not(marker):
    assert is_missing(marker)
    assert not any(is_missing(v) for v in ("0", "-1", "neg", "1", "Mixed", "n"))


def test_abbreviations_and_full_words_are_two_classes_not_four():
    values = ["pos", "neg", "Positive", "NEGATIVE", "positive.", "Neg"] * 3
    labels = infer_label_set(values)
    assert labels.names == ("Negative", "Positive")
    notes = label_notes(values, labels)
    assert any("spellings merged into Negative: neg, NEGATIVE, Neg" in n for n in notes), notes


def test_two_unicode_forms_are_one_class_and_flags_agree():
    labels = infer_label_set([CAFE, CAFE_DECOMPOSED, "Bar"])
    assert len(labels.names) == 2
    explicit = resolve_label_set(
        [CAFE_DECOMPOSED, "Bar"],
        parse_labels_flag(f"{CAFE},Bar"),
        parse_mapping_flag(f"{CAFE_DECOMPOSED}={CAFE},bar=Bar"),
    )
    assert explicit.map(CAFE_DECOMPOSED) == CAFE and explicit.map(CAFE) == CAFE


@pytest.mark.parametrize(
    "labels, mapping, error",
    [
        (
            "Neg,Negative,Positive",
            None,
            r"ambiguous class names: \['Neg', 'Negative'\] are one class",
        ),
        (
            None,
            "neg=Negative,NEGATIVE=Bad",
            r"\['neg', 'NEGATIVE'\] are one label value .* mapped to 'Negative' "
            r"and 'Bad'",
        ),
        (f"{CAFE},{CAFE_DECOMPOSED}", None, r"ambiguous class names: \['Café', 'Café'\]"),
    ],
)
def test_an_ambiguous_merge_is_refused_with_the_values_and_the_flag(labels, mapping, error):
    with pytest.raises(LabelError, match=error) as info:
        resolve_label_set(
            ["neg", "pos"],
            parse_labels_flag(labels) if labels else None,
            parse_mapping_flag(mapping) if mapping else None,
        )
    assert "--labels" in str(info.value) or "--label-mapping" in str(info.value)


def test_missing_markers_are_quarantined_never_a_class_never_a_refusal():
    labels = ["1", "-1", "N/A", "NaN", "?", "-", "", "null", None, "1"]
    label_set = resolve_label_set(labels)  # no refusal: the markers are not values
    assert label_set == BINARY_LABEL_SET
    raw = pa.table(
        {
            "text": [f"review {i}" for i in range(len(labels))],
            "label": labels,
            "source_file": ["f"] * len(labels),
            "source_row": list(range(len(labels))),
            "malformed": pa.nulls(len(labels), pa.string()),
        }
    )
    result = validate(raw, ValidationRules(labels=label_set))
    assert result.reasons == {"missing_label": 7}
    assert result.label_counts == {"Negative": 1, "Positive": 2}


def test_minus_one_one_is_binary_and_said():
    labels = resolve_label_set(["-1", "1.0", "1", "-1.0"])
    assert labels.names == ("Negative", "Positive") and labels.map("-1.0") == "Negative"
    assert label_notes(["-1", "1"], labels)[0].startswith("values -1/1 only: a binary set")
    for ambiguous in (["-1", "0"], ["0", "1"]):
        with pytest.raises(LabelError, match="ambiguous"):
            infer_label_set(ambiguous)


def test_refusals_speak_of_what_the_user_passed():
    with pytest.raises(LabelError) as info:  # nothing passed: no "drop the class from --labels"
        resolve_label_set(["-1", "0", "-1"])
    assert "drop" not in str(info.value) and "--labels" in str(info.value)
    with pytest.raises(LabelError) as info:
        resolve_label_set(["-1.0", "1.0"], parse_labels_flag("Negative,Mixed,Positive"))
    assert "none of them is a class of --labels Negative,Mixed,Positive" in str(info.value)
    assert "--label-mapping -1=<name>,1=<name>" in str(info.value)
    with pytest.raises(LabelError, match=r"drop \['Mixed'\] from --labels Negative,Positive,Mixed"):
        resolve_label_set(
            ["-1", "1"],
            parse_labels_flag("Negative,Positive,Mixed"),
            parse_mapping_flag("-1=Negative,1=Positive"),
        )


def test_label_set_keys_are_stable_for_the_seed():
    """The seed's set keeps its fingerprint (published data versions do not change)."""
    from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET

    assert (
        DEFAULT_LABEL_SET.fingerprint()
        == LabelSet.from_dict(DEFAULT_LABEL_SET.to_dict()).fingerprint()
    )
    assert dict(DEFAULT_LABEL_SET.mapping) == {
        "-1": "Negative",
        "0": "Mixed",
        "1": "Positive",
        "mixed": "Mixed",
        "negative": "Negative",
        "neutral": "Mixed",
        "positive": "Positive",
    }


def _minus_one_one_csv(tmp_path: Path) -> Path:
    if ATT.exists():
        return ATT
    path = tmp_path / "att.csv"
    path.write_text(
        ",text,polarity\n"
        + "".join(f'{i},"review {i}\nline two",{1 if i % 3 else -1}\n' for i in range(60))
    )
    return path


def test_versions_add_minus_one_one_with_no_flags_and_with_a_dash_mapping(
    capsys, dagster_home, storage_root, tmp_path
):
    """The shared ATT.csv (real reviews, -1/1 only) registers two classes with no flags; the mapping
    flag parses as users type it (``--label-mapping -1=...``, which argparse alone reads as an
    option).
    """
    source = str(_minus_one_one_csv(tmp_path))
    root = ("--root", str(storage_root))
    code, out, err = run_cli(capsys, *root, "versions", "add", "att", "--source", source)
    assert code == 0, err
    assert "labels: Negative, Positive" in out and "binary set" in out
    record = json.loads((storage_root / "versions" / "att.json").read_text())
    assert record["labels"]["names"] == ["Negative", "Positive"]
    code, out, err = run_cli(
        capsys,
        *root,
        "versions",
        "add",
        "att2",
        "--source",
        source,
        "--label-mapping",
        "-1=Bad,1=Good",
    )
    assert code == 0, err
    assert json.loads((storage_root / "versions" / "att2.json").read_text())["labels"] == {
        "names": ["Bad", "Good"],
        "mapping": {"-1": "Bad", "1": "Good"},
    }
