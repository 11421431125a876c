"""Exports as spreadsheets make them, registered black-box through ``versions add`` +
``raw_reviews``: a ``;``-separated CSV (European Excel), Excel's "Unicode Text" (UTF-16-LE with a
byte-order mark, tab-separated) over the 1 MiB registration sample, a UTF-32 file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_assets.data.sources import SourceSpec, read_source
from finetune_assets_tests.conftest import _real_rows
from finetune_assets_tests.data.test_table_sources import _add, _raw, home  # noqa: F401


@pytest.fixture(scope="module")
def reviews(arabic_reviews: Path) -> list[tuple[str, str]]:
    return [(t, lab) for t, lab in _real_rows(arabic_reviews / "PROD.csv") if lab != "Mixed"]


def _quoted(value: str, delimiter: str) -> str:
    if any(c in value for c in (delimiter, '"', "\n", "\r")):
        return '"' + value.replace('"', '""') + '"'
    return value


def test_semicolon_csv_registers_with_its_two_classes_and_no_flags(
    capsys,
    home,
    storage_root,
    tmp_path,
    reviews,  # noqa: F811
):
    rows = reviews[:80]
    path = tmp_path / "export.csv"
    lines = ["review;polarity"] + [f"{_quoted(t, ';')};{lab}" for t, lab in rows]
    path.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    code, out, err = run_add(capsys, home, "eu", str(path))
    assert code == 0, err
    assert "Negative" in out and "Positive" in out
    record = json.loads(Path(home["store"].url("versions", "eu.json")).read_text())
    assert record["source"]["delimiter"] == ";"  # the choice is part of the version
    meta, table = _raw(storage_root, "eu")
    assert meta["rows_in"] == len(rows)
    assert set(table.column("label").to_pylist()) == {"Negative", "Positive"}


def run_add(capsys, home, key, source, *args):  # noqa: F811
    """``versions add`` with no --labels: the classes are inferred."""
    from finetune_assets_tests.test_cli import run_cli

    return run_cli(capsys, *home["root"], "versions", "add", key, "--source", source, *args)


def test_utf16_unicode_text_export_over_the_sample_registers(
    capsys,
    home,
    storage_root,
    tmp_path,
    reviews,  # noqa: F811
):
    rows = (reviews * 40)[:9000]
    rows = [(f"{t} ({i})", lab) for i, (t, lab) in enumerate(rows)]  # no duplicates
    text = "review\tpolarity\r\n" + "".join(f"{_quoted(t, chr(9))}\t{lab}\r\n" for t, lab in rows)
    data = text.encode("utf-16")  # Excel's "Unicode Text": a BOM, then UTF-16-LE
    assert data.startswith(b"\xff\xfe") and len(data) > 1 << 20
    path = tmp_path / "export.tsv"
    path.write_bytes(data)
    code, out, err = run_add(capsys, home, "u16", str(path))
    assert code == 0, err
    meta, _ = _raw(storage_root, "u16")
    assert meta["rows_in"] == len(rows)


def test_utf32_bom_is_read_as_utf32(tmp_path, reviews):
    rows = reviews[:20]
    path = tmp_path / "r.csv"
    path.write_bytes(
        ("text,label\n" + "".join(f"{_quoted(t, ',')},{lab}\n" for t, lab in rows)).encode("utf-32")
    )
    table = read_source(SourceSpec(uri=str(path)))
    assert table.column("text").to_pylist() == [t for t, _ in rows]


@pytest.mark.parametrize("delimiter", ["|", "\t", ","])
def test_delimiter_is_sniffed_or_given(tmp_path, reviews, delimiter):
    rows = reviews[:20]
    path = tmp_path / "r.csv"
    path.write_text(
        f"text{delimiter}label\n"
        + "".join(f"{_quoted(t, delimiter)}{delimiter}{lab}\n" for t, lab in rows),
        encoding="utf-8",
    )
    for spec in (SourceSpec(uri=str(path)), SourceSpec(uri=str(path), delimiter=delimiter)):
        assert read_source(spec).column("label").to_pylist() == [lab for _, lab in rows]


def test_stray_nuls_in_text_quarantine_their_lines(capsys, home, storage_root, tmp_path, reviews):  # noqa: F811
    """A database export with a few NUL bytes inside reviews: the file registers, the rows
    holding a NUL are quarantined (counted), the rest published.
    """
    rows = reviews[:60]
    lines = ["text,label"]
    for i, (t, lab) in enumerate(rows):
        lines.append(f"{_quoted(t + (chr(0) if i in (4, 20, 33) else ''), ',')},{lab}")
    path = tmp_path / "export.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = run_add(capsys, home, "nul", str(path))
    assert code == 0, err
    meta, table = _raw(storage_root, "nul")
    assert meta["rows_in"] == len(rows) and meta["rejected_rows"] == 3, meta["rejected_by_reason"]
    assert not any("\x00" in t for t in table.column("text").to_pylist())


def test_jsonl_text_key_is_resolved_per_record(capsys, home, storage_root, tmp_path, reviews):  # noqa: F811
    """``text`` in some records, ``review`` in others (two exports appended): every record's own
    key is its text, nothing quarantined, both classes found.
    """
    rows = reviews[:60]
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        "".join(
            json.dumps({"text" if i % 3 else "review": t, "label": lab}, ensure_ascii=False) + "\n"
            for i, (t, lab) in enumerate(rows)
        ),
        encoding="utf-8",
    )
    code, out, err = run_add(capsys, home, "j", str(path))
    assert code == 0, err
    meta, table = _raw(storage_root, "j")
    assert meta["rows_in"] == len(rows) and meta["rejected_rows"] == 0, meta["rejected_by_reason"]
    assert sorted(table.column("text").to_pylist()) == sorted(t for t, _ in rows)


def test_tsv_without_quoting_registers_with_quoting_none(
    capsys, home, storage_root, tmp_path, reviews
):  # noqa: F811
    """A TSV that never quotes (``5" screen`` in a review): ``--quoting none`` reads every line
    as one record, and the choice is part of the version.
    """
    rows = [(f'{t} 5" screen' if i % 4 == 0 else t, lab) for i, (t, lab) in enumerate(reviews[:60])]
    path = tmp_path / "export.tsv"
    path.write_text("text\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in rows), encoding="utf-8")
    code, out, err = run_add(capsys, home, "q", str(path), "--quoting", "none")
    assert code == 0, err
    record = json.loads(Path(home["store"].url("versions", "q.json")).read_text())
    assert record["source"]["quoting"] == "none"
    meta, table = _raw(storage_root, "q")
    assert meta["rows_in"] == len(rows) and meta["rejected_rows"] == 0, meta["rejected_by_reason"]
    assert sorted(table.column("text").to_pylist()) == sorted(t for t, _ in rows)
