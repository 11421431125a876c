"""The data path on the real Arabic review files: reading, label mapping, counts, stable splits,
shards.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from finetune_assets.core.io.contracts import SPLITS
from finetune_assets.core.prep.pretrained import packaged_model_dir
from finetune_assets.core.prep.tokenize import token_dtype
from finetune_assets.core.prep.validate import SplitRule, ValidationRules, normalize_text, validate
from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets_tests.core.conftest import count_csv_rows, csv_rows
from finetune_assets_tests.data_path import prepare, tokenize

POLARITY = {"1": "Positive", "-1": "Negative", "0": "Mixed"}


def _read(path: Path):
    raw = read_source(SourceSpec(uri=str(path)))
    return raw, validate(raw, ValidationRules())


def test_prod_numeric_labels_map_to_the_three_classes(arabic_reviews: Path):
    path = arabic_reviews / "PROD.csv"
    raw, result = _read(path)
    expected = csv_rows(path)
    assert raw.num_rows == count_csv_rows(path) == len(expected) == 4272
    assert raw.column("label").to_pylist() == [r["polarity"] for r in expected]
    assert raw.column("text").to_pylist() == [r["text"] or None for r in expected]
    # every accepted row carries the class its file row's polarity maps to
    by_row = {i: POLARITY[r["polarity"]] for i, r in enumerate(expected)}
    accepted = result.accepted.to_pylist()
    assert all(row["label"] == by_row[row["source_row"]] for row in accepted)
    assert {row["label"] for row in accepted} == {"Positive", "Negative", "Mixed"}
    # counts of the mapping, computed independently over the rows validation accepted
    expected_counts = Counter(by_row[row["source_row"]] for row in accepted)
    assert result.label_counts == dict(expected_counts)


def test_att_index_column_multiline_texts_and_float_labels(arabic_reviews: Path):
    path = arabic_reviews / "ATT.csv"
    raw, result = _read(path)
    expected = csv_rows(path)
    assert list(expected[0]) == ["", "text", "polarity"]  # the unnamed index column
    assert raw.num_rows == count_csv_rows(path) == len(expected) == 2154
    assert {r["polarity"] for r in expected} == {"1.0", "-1.0"}
    texts = raw.column("text").to_pylist()
    assert texts == [r["text"] for r in expected]  # byte-identical, newlines kept
    assert sum("\n" in t for t in texts) > 1000  # multi-line quoted reviews survive as one row each
    assert not any(t.isdigit() for t in texts)  # the index column was not taken for the text
    accepted = result.accepted.to_pylist()
    assert all(
        row["label"] == POLARITY[str(int(float(expected[row["source_row"]]["polarity"])))]
        for row in accepted
    )
    assert result.label_counts["Mixed"] == 0
    assert result.label_counts["Negative"] == sum(r["polarity"] == "-1.0" for r in expected) - sum(
        1 for row in result.rejected.to_pylist() if row["label"] == "-1.0"
    )


@pytest.mark.parametrize("name", ["PROD.csv", "ATT.csv", "RES2.csv"])
def test_accepted_plus_rejected_equals_rows_in_file(arabic_reviews: Path, name: str):
    path = arabic_reviews / name
    raw, result = _read(path)
    n_file = count_csv_rows(path)
    assert raw.num_rows == n_file
    assert result.accepted.num_rows + result.rejected.num_rows == n_file
    # each file row is accounted for exactly once, accepted or rejected
    rows = sorted(
        result.accepted.column("source_row").to_pylist()
        + result.rejected.column("source_row").to_pylist()
    )
    assert rows == list(range(n_file))
    assert set(result.reasons) <= {"empty_text", "duplicate", "conflicting_duplicate"}


def test_duplicates_in_prod_are_quarantined_with_reason(arabic_reviews: Path):
    path = arabic_reviews / "PROD.csv"
    _, result = _read(path)
    copies: dict[str, list[str]] = {}
    for r in csv_rows(path):
        if r["text"].strip():
            copies.setdefault(normalize_text(r["text"]), []).append(r["polarity"])
    # one copy kept when the copies agree or a majority label holds (3+ copies); else none
    # (core/prep/conflicts.py)
    kept = [
        len(ls) >= 3 and 2 * Counter(ls).most_common(1)[0][1] > len(ls) or len(set(ls)) == 1
        for ls in copies.values()
    ]
    expected_dups = sum(len(ls) - keep for ls, keep in zip(copies.values(), kept) if len(ls) > 1)
    assert (
        result.reasons.get("duplicate", 0) + result.reasons.get("conflicting_duplicate", 0)
        == expected_dups
    )
    assert (
        len({normalize_text(t) for t in result.accepted.column("text").to_pylist()})
        == result.accepted.num_rows
    )


def test_folder_source_reads_every_file(arabic_reviews: Path):
    raw = read_source(SourceSpec(uri=str(arabic_reviews)))
    total = sum(count_csv_rows(arabic_reviews / n) for n in ("ATT.csv", "PROD.csv", "RES2.csv"))
    assert raw.num_rows == total
    files = Counter(Path(f).name for f in raw.column("source_file").to_pylist())
    assert files == {
        n: count_csv_rows(arabic_reviews / n) for n in ("ATT.csv", "PROD.csv", "RES2.csv")
    }


def test_splits_are_stable_across_versions_sharing_rows(arabic_reviews: Path, tmp_path: Path):
    """v1 = PROD, v2 = PROD + ATT: every PROD review lands in the same split in both versions."""
    v2_dir = tmp_path / "v2"
    v2_dir.mkdir()
    for name in ("PROD.csv", "ATT.csv"):
        (v2_dir / name).write_bytes((arabic_reviews / name).read_bytes())
    rule = SplitRule()

    def splits_by_text(uri: str, name: str) -> dict[str, str]:
        accepted = validate(read_source(SourceSpec(uri=uri)), ValidationRules(split=rule)).accepted
        table = tokenize(accepted, packaged_model_dir(), tmp_path / name, 64).table()
        # tokenized_reviews carries raw_reviews' split unchanged, row for row
        assert (
            table.column("split").cast(pa.string()).to_pylist()
            == accepted.column("split").to_pylist()
        )
        return dict(
            zip(
                accepted.column("text").to_pylist(),
                table.column("split").cast(pa.string()).to_pylist(),
            )
        )

    v1 = splits_by_text(str(arabic_reviews / "PROD.csv"), "tokens-v1")
    v2 = splits_by_text(str(v2_dir), "tokens-v2")
    assert len(v2) > len(v1) > 4000
    assert all(v2[text] == split for text, split in v1.items())
    shares = Counter(v2.values())
    for split, frac in (("validation", 0.1), ("test", 0.1)):  # the hash split honours the fractions
        assert abs(shares[split] / len(v2) - frac) < 0.02
    # the split depends on the normalized text only, and not on the row's position or other rows
    assert rule.assign(["  Hello   WORLD "]) == rule.assign(["hello world"])


def test_tokenize_real_reviews_matches_hf_truncation(
    arabic_reviews: Path, tokenizer, tmp_path: Path
):
    accepted = validate(
        read_source(SourceSpec(uri=str(arabic_reviews / "RES2.csv"))), ValidationRules()
    ).accepted
    accepted = accepted.slice(0, 400)
    max_length = 64
    # 4 row groups, 2 slices a worker: batches and slices join up row for row
    tokenized = tokenize(
        accepted,
        packaged_model_dir(),
        tmp_path / "tokens",
        max_length,
        workers=2,
        slice_rows=100,
        batch_size=64,
        row_group_rows=100,
    )
    assert len(tokenized.parts) == 4
    table = tokenized.table()
    texts = accepted.column("text").to_pylist()
    expected = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    got = table.column("input_ids").to_pylist()
    assert got == expected
    assert table.column("input_ids").type.value_type == pa.uint16()  # 30522-token vocab fits uint16
    assert token_dtype(len(tokenizer)) == np.uint16
    full = tokenizer(texts)["input_ids"]
    assert table.column("full_length").to_pylist() == [len(x) for x in full]
    assert table.column("length").to_pylist() == [min(len(x), max_length) for x in full]
    labels = {"Positive": 0, "Negative": 1, "Mixed": 2}
    assert table.column("label").to_pylist() == [
        labels[x] for x in accepted.column("label").to_pylist()
    ]
    stats = tokenized.length_stats()  # what the asset reports, from the slices' histograms
    truncated = sum(len(x) > max_length for x in full) / len(full)
    assert math.isclose(stats["truncated_share"], round(truncated, 4))
    assert stats["max"] == max(len(x) for x in full)


def test_mds_shards_read_back_to_exactly_the_tokenized_rows(
    arabic_reviews: Path, tmp_path: Path, open_dataset
):
    from finetune_assets.core.shards.mds import read_back_count

    accepted = validate(
        read_source(SourceSpec(uri=str(arabic_reviews / "PROD.csv"))), ValidationRules()
    ).accepted
    # small shards (several per split) from 2 token parts
    tokenized, results = prepare(
        accepted,
        packaged_model_dir(),
        tmp_path,
        128,
        size_limit=1 << 16,
        workers=2,
        row_group_rows=1024,
    )
    table = tokenized.table()
    out = tmp_path / "shards"
    assert results["train"].shards > 1 and len(tokenized.parts) == 2
    split_col = table.column("split").cast(pa.string()).to_pylist()
    ids_col = table.column("input_ids").to_pylist()
    label_col = table.column("label").to_pylist()
    assert sum(r.samples for r in results.values()) == table.num_rows
    for split in SPLITS:
        want = [(ids, label) for ids, label, s in zip(ids_col, label_col, split_col) if s == split]
        assert results[split].samples == len(want) == read_back_count(out / split) > 0
        # reading back does not leave decompressed copies in the published folder: the merged
        # index and split_stats.json, then each part's index and zstd shards
        files = sorted(str(p.relative_to(out / split)) for p in (out / split).rglob("*.*"))
        shards = [f for f in files if f.endswith(".mds.zstd")]
        assert len(shards) == results[split].shards
        assert set(files) - set(shards) == {"index.json", "split_stats.json"} | {
            f"{i:05d}/index.json" for i in range(len(tokenized.parts))
        }
        # what the trainer's class weights read
        stats = json.loads((out / split / "split_stats.json").read_text())
        assert stats == {
            "samples": len(want),
            "label_counts": {
                str(lbl): sum(1 for _, x in want if x == lbl)
                for lbl in sorted({x for _, x in want})
            },
        }
        ds = open_dataset(
            remote=str(out / split),
            local=str(tmp_path / "cache" / split),
            shuffle=False,
            batch_size=1,
        )
        got = []
        for i in range(ds.num_samples):
            sample = ds[i]
            assert sample["input_ids"].dtype == np.uint16
            got.append((sample["input_ids"].tolist(), int(sample["label"])))
        assert got == want, split
        # the parts' files: shards and their indexes
        assert results[split].bytes == sum(p.stat().st_size for p in (out / split).glob("*/*"))
        del ds


def test_empty_split_writes_and_reads_back_as_zero(tmp_path: Path):
    from finetune_assets.core.shards.mds import read_back_count

    accepted = pa.table(
        {
            "text": ["one good review", "another fine review"],
            "label": ["Positive", "Mixed"],
            "split": ["train", "train"],
        }
    )
    _, results = prepare(accepted, packaged_model_dir(), tmp_path, 32)
    assert results["train"].samples == 2
    assert results["validation"].samples == results["test"].samples == 0
    assert read_back_count(tmp_path / "shards" / "validation") == 0
    assert read_back_count(tmp_path / "shards" / "train") == 2


def test_split_rule_rejects_bad_fractions():
    with pytest.raises(ValueError, match="fractions"):
        SplitRule(validation=0.6, test=0.5)


def test_tokenize_refuses_reviews_without_raw_reviews_split(tmp_path: Path):
    with pytest.raises(ValueError, match="no 'split' column"):
        tokenize(
            pa.table({"text": ["x"], "label": ["Positive"]}), packaged_model_dir(), tmp_path / "a"
        )
    with pytest.raises(ValueError, match="split column holds"):
        tokenize(
            pa.table({"text": ["x"], "label": ["Positive"], "split": ["dev"]}),
            packaged_model_dir(),
            tmp_path / "b",
        )


def test_tokenize_rejects_too_small_max_length(tmp_path: Path):
    with pytest.raises(ValueError, match="max_length"):
        tokenize(
            pa.table({"text": ["x"], "label": ["Positive"], "split": ["train"]}),
            packaged_model_dir(),
            tmp_path,
            1,
        )
