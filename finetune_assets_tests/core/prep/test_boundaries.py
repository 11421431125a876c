"""Folders through symlinks, near-duplicates and splits, and the messages for inputs that are not
text.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from finetune_assets.core.prep.validate import (
    SplitRule,
    ValidationRules,
    normalize_text,
    split_key,
    validate,
)
from finetune_assets.core.sources import SourceError, SourceSpec, list_source, read_source

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def test_symlinked_folders_and_files_are_followed_once_and_loops_named(tmp_path: Path):
    real = tmp_path / "exports"
    real.mkdir()
    (real / "a.csv").write_text("text,label\nfrom a,1\n")
    drop = tmp_path / "drop"
    drop.mkdir()
    (drop / "b.csv").write_text("text,label\nfrom b,-1\n")
    (drop / "linked").symlink_to(real, target_is_directory=True)  # a folder link: followed
    (drop / "again").symlink_to(real, target_is_directory=True)  # a second path to it: read once
    (drop / "b_copy.csv").symlink_to(drop / "b.csv")  # a file link to a file already read
    (real / "loop").symlink_to(drop, target_is_directory=True)  # exports/loop -> drop: a loop
    listing = list_source(str(drop))
    assert sorted(Path(f).relative_to(drop).as_posix() for f in listing.files) == [
        "b.csv",
        "linked/a.csv",
    ] or sorted(Path(f).relative_to(drop).as_posix() for f in listing.files) == [
        "again/a.csv",
        "b.csv",
    ]
    reasons = {Path(p).relative_to(drop).as_posix(): why for p, why in listing.ignored.items()}
    assert any(
        "symlink loop" in why and f"-> {os.path.realpath(drop)}" in why for why in reasons.values()
    ), reasons
    assert any(why.startswith("same folder as") for why in reasons.values())
    assert reasons["b_copy.csv"].startswith("same file as")
    texts = sorted(read_source(SourceSpec(uri=str(drop))).column("text").to_pylist())
    assert texts == ["from a", "from b"]


def test_near_duplicates_never_straddle_splits():
    rule = SplitRule(validation=0.3, test=0.3)
    variants = [
        "Great phone, fast delivery!",
        "great phone fast delivery",
        "GREAT PHONE - fast delivery...",
        "great  phone,fast   delivery",
    ]
    for i in range(200):
        texts = [f"{v} #{i}" for v in variants]
        assert len({normalize_text(t) for t in texts}) > 1  # not duplicates: all are kept
        assert len(set(rule.assign(texts))) == 1  # but one split
    assert split_key(normalize_text("!!!")) == "!!!"  # no letters: the text itself


def test_binary_file_in_a_source_says_what_it_is(tmp_path: Path):
    path = tmp_path / "reviews.csv"
    path.write_bytes(PNG)
    with pytest.raises(
        SourceError, match=r"reviews\.csv: this is a PNG image, not csv text; export the"
    ):
        read_source(SourceSpec(uri=str(path)))


@pytest.mark.parametrize("command", ["predict", "evaluate"])
@pytest.mark.parametrize(
    "name,body,what",
    [
        ("photo.png", PNG, "a PNG image"),
        ("reviews.xlsx", b"PK\x03\x04" + bytes(200), "a zip archive (an Excel .xlsx"),
        ("reviews.xls", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(200), "an old Office document"),
    ],
)
def test_predict_and_evaluate_name_a_binary_file_and_the_fix(
    capsys, tmp_path, command, name, body, what
):
    from finetune_assets_tests.cli.test_cli import run_cli

    path = tmp_path / name
    path.write_bytes(body)
    code, _, err = run_cli(capsys, command, "--model", str(tmp_path), "--file", str(path))
    assert code == 2
    assert f"{path}: this is {what}" in err and f"not text that {command} can read" in err
    assert "CSV UTF-8" in err and "encoding" not in err


def test_an_unusable_storage_root_names_the_setting(tmp_path: Path):
    from finetune_assets.core.io.storage import Storage, StorageRootError

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    # under a file: cannot be created (as under /proc for root)
    store = Storage(str(blocker / "root"))
    with pytest.raises(StorageRootError) as info:
        with store.publish("raw_reviews", "v1") as staging:
            staging.data_version = "x"
    message = str(info.value)
    assert message.startswith(f"storage root {blocker / 'root'}: cannot create")
    assert "$FINETUNE_ASSETS_ROOT (CLI --root, Dagster resource `storage` root)" in message


def test_conflicting_copies_majority_wins_else_all_quarantined_and_first_keeps_todays_rule():
    import pyarrow as pa

    def run(labels, **kw):
        n = len(labels)
        raw = pa.table(
            {
                "text": ["same"] * n + ["other"],
                "label": labels + ["1"],
                "source_file": ["f"] * (n + 1),
                "source_row": list(range(n + 1)),
                "malformed": pa.nulls(n + 1, pa.string()),
            }
        )
        result = validate(raw, ValidationRules(**kw))
        assert result.accepted.num_rows + result.rejected.num_rows == n + 1
        kept = [
            (r["source_row"], r["label"])
            for r in result.accepted.to_pylist()
            if r["text"] == "same"
        ]
        return kept, sorted((r["source_row"], r["reason"]) for r in result.rejected.to_pylist())

    assert run(["-1", "1", "1"]) == (
        [(1, "Positive")],
        [(0, "conflicting_duplicate"), (2, "duplicate")],
    )
    assert run(["1", "-1"]) == ([], [(0, "conflicting_duplicate"), (1, "conflicting_duplicate")])
    assert run(["1", "-1", "-1", "1"])[0] == []
    assert run(["1", "-1"], duplicate_conflicts="first") == (
        [(0, "Positive")],
        [(1, "conflicting_duplicate")],
    )


@pytest.mark.parametrize("block", [61, 300])
@pytest.mark.parametrize(
    "name", ["mixed_line_endings", "repeated_headers", "jsonl_text_key_changes"]
)
def test_new_record_boundaries_stream_like_the_whole_file(tmp_path: Path, name: str, block: int):
    """A record whose line end is decided by the next record is re-read with the next block, so
    blocks cut anywhere give the same rows, reasons and raw text as the whole-file read.
    """
    import random

    from finetune_assets_tests.core.sources.hostile import GENERATORS
    from finetune_assets_tests.core.sources.test_source_streaming import assert_streams_like_whole

    # past the first block's 4 KiB
    gens = [GENERATORS[name](random.Random(seed)) for seed in range(8)]
    path = tmp_path / gens[0].name
    path.write_bytes(b"".join(g.body for g in gens))
    whole = assert_streams_like_whole(path, block)
    assert whole.num_rows == sum(g.rows for g in gens) + (len(gens) - 1) * path.suffix.endswith(
        "csv"
    )
