"""Exports as spreadsheets make them, registered black-box through ``versions add`` +
``raw_reviews``: a ``;``-separated CSV (European Excel), Excel's "Unicode Text" (UTF-16-LE with a
byte-order mark, tab-separated) over the 1 MiB registration sample, a UTF-32 file.
"""

from __future__ import annotations

import csv
import io
import json
import random
from pathlib import Path

import pytest

from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets_tests.conftest import _real_rows
from finetune_assets_tests.core.sources.test_table_sources import _add, _raw, home  # noqa: F401


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
    from finetune_assets_tests.cli.test_cli import run_cli

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


def _mixed_line_end_export(reviews: list[tuple[str, str]], seed: int) -> tuple[str, list[str]]:
    """``cat`` of Windows, Unix and classic-Mac exports, record ends switching from record to
    record among LF, CRLF and a bare CR, a quarter of the reviews quoted over several lines (inner
    line breaks of every kind), and two reviews broken over two lines without quotes between CRLF
    records (the review before one may be taken for its first half too, where its line end is the
    odd one). (text, the reviews whose rows may be quarantined with them, the others).
    """
    rng = random.Random(seed)
    ends = ["\n", "\r\n", "\r"]
    parts, published, neighbours = ["review,polarity\r\n"], [], []
    for i, (t, lab) in enumerate(reviews):
        t = f"{t} ({i})"  # no duplicates
        if i % 4 == 1:
            words = t.split(" ")
            cut = max(1, len(words) // 2)
            t = " ".join(words[:cut]) + rng.choice(ends) + " ".join(words[cut:]) + ' "sic"'
        if i in (30, 70):  # a review's line break written without quotes: never two reviews
            parts.append(f"first half of a review {i}\nits second half,{lab}\r\n")
        parts.append(f"{_quoted(t, ',')},{lab}{rng.choice(ends)}")
        (neighbours if i in (29, 69) else published).append(t)
    return "".join(parts), neighbours, published


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_record_ends_never_publish_a_fragment(
    capsys,
    home,
    storage_root,
    tmp_path,
    reviews,  # noqa: F811
    seed,
):
    """One file mixing LF, CRLF and bare-CR record ends around multi-line quoted reviews: every
    review is published whole (quoted line breaks stay inside the field), nothing else is, and only
    the two unquoted broken reviews' lines (and a review before one whose line end is the odd one
    out) are quarantined, counted; streamed in small blocks it reads the same.
    """
    from finetune_assets_tests.core.sources.test_source_streaming import assert_streams_like_whole

    text, neighbours, published = _mixed_line_end_export(reviews[:120], seed)
    path = tmp_path / "mixed.csv"
    path.write_bytes(text.encode())
    code, out, err = run_add(capsys, home, f"mix{seed}", str(path))
    assert code == 0, err
    meta, table = _raw(storage_root, f"mix{seed}")
    texts = table.column("text").to_pylist()
    kept = [t for t in neighbours if t in texts]
    assert meta["rows_in"] == len(published) + len(neighbours) + 4
    assert meta["rejected_by_reason"] == {"ambiguous_line_end": 6 - len(kept)}
    assert sorted(texts) == sorted(published + kept)
    assert_streams_like_whole(path, 4096)


def test_backslash_escaped_quotes_register_with_escapechar(
    capsys,
    home,
    storage_root,
    tmp_path,
    reviews,  # noqa: F811
):
    """A dump writing ``\\"`` for a quote inside quoted reviews (MySQL ``ESCAPED BY '\\\\'``,
    PostgreSQL ``ESCAPE``), a backslash also before a delimiter and a line break in unquoted
    text: ``--escapechar '\\'`` reads every review as Python's ``csv`` does with that escape
    character, nothing quarantined, and the choice is part of the version.
    """
    rows = []
    for i, (t, lab) in enumerate(reviews[:60]):
        t = f"{t} ({i})"
        if i % 3 == 0:
            t = f'{t} 5" screen, "sic"'
        elif i % 3 == 1:
            t = f"{t} a back\\slash\nand a line"
        rows.append((t, lab))
    lines = ["text,label"]
    for i, (t, lab) in enumerate(rows):
        escaped = t.replace("\\", "\\\\").replace('"', '\\"')
        if i % 6 == 1:  # unquoted: the delimiter and the line break escaped
            lines.append(escaped.replace(",", "\\,").replace("\n", "\\\n") + f",{lab}")
        else:
            lines.append(f'"{escaped}",{lab}')
    path = tmp_path / "dump.csv"
    path.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    expected = list(csv.reader(io.StringIO(path.read_text(), newline=""), escapechar="\\"))[1:]
    assert [tuple(r) for r in expected] == rows  # what Python's csv reads
    code, out, err = run_add(capsys, home, "esc", str(path), "--escapechar", "\\")
    assert code == 0, err
    record = json.loads(Path(home["store"].url("versions", "esc.json")).read_text())
    assert record["source"]["escapechar"] == "\\"
    meta, table = _raw(storage_root, "esc")
    assert meta["rows_in"] == len(rows) and meta["rejected_rows"] == 0, meta["rejected_by_reason"]
    assert sorted(table.column("text").to_pylist()) == sorted(t for t, _ in rows)
