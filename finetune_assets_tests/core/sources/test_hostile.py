"""Hostile inputs from :mod:`hostile`: exact row accounting against counts the generator knows
independently.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import random
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from finetune_assets.core.prep.validate import ValidationRules, validate
from finetune_assets.core.sources import SourceError, SourceSpec, list_source, read_source
from finetune_assets_tests.core.sources.hostile import GENERATORS, TOKEN, Generated


def _check(gen: Generated, path: Path, spec: dict | None = None) -> None:
    raw = read_source(SourceSpec(uri=str(path), **(spec or {})))
    result = validate(raw, ValidationRules())
    assert raw.num_rows == gen.rows  # every physical record, counted by the generator
    assert result.accepted.num_rows + result.rejected.num_rows == gen.rows
    assert result.reasons == gen.reasons
    accepted = result.accepted.column("text").to_pylist()
    tokens = [TOKEN.findall(t) for t in accepted]
    # no merges
    assert all(len(t) == 1 for t in tokens), [t for t in accepted if len(TOKEN.findall(t)) != 1][:3]
    assert {t[0] for t in tokens} == gen.accepted_tokens
    bad = result.rejected.filter(
        pa.compute.equal(result.rejected.column("reason"), "malformed_row")
    ).to_pylist()
    for row in bad:  # locatable and recoverable: file, line, raw text
        assert (
            row["source_file"] == str(path) and row["source_line"] >= 2 and row["raw"] is not None
        )
    # the quarantined raw text of a malformed record is its line in the file
    lines = gen.body.decode(
        gen.encoding if not gen.body.startswith(b"\xff\xfe") else "utf-16"
    ).splitlines()
    for row in bad:
        assert row["raw"][:200] in lines[row["source_line"] - 1]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(GENERATORS))
def test_hostile_file(name: str, seed: int, tmp_path: Path):
    gen = GENERATORS[name](random.Random(seed))
    path = tmp_path / gen.name
    path.write_bytes(gen.body)
    _check(gen, path)


def test_stray_quote_costs_one_line_not_the_rest_of_the_file(tmp_path: Path):
    gen = GENERATORS["stray_quote_no_more_quotes"](random.Random(3))
    path = tmp_path / gen.name
    path.write_bytes(gen.body)
    raw = read_source(SourceSpec(uri=str(path)))
    bad = raw.filter(pa.compute.is_valid(raw.column("malformed"))).to_pylist()
    assert [(r["source_line"], r["source_line_end"]) for r in bad] == [(42, 42)]
    assert "never closed" in bad[0]["malformed"] and bad[0]["raw"].startswith(
        '"an unclosed review start'
    )


def _compress(body: bytes, codec: str) -> bytes:
    if codec == "zstd":
        sink = pa.BufferOutputStream()
        with pa.CompressedOutputStream(sink, "zstd") as out:
            out.write(body)
        return sink.getvalue().to_pybytes()
    return {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[codec](body)


def test_folder_reads_every_data_file_and_lists_what_it_ignores(tmp_path: Path):
    """Compressed files and ``_``-prefixed names are read; hidden folders (a stale notebook
    checkpoint), OS metadata and docs are ignored and listed; the accounting holds over the whole
    folder.
    """
    rng = random.Random(7)
    folder = tmp_path / "drop"
    (folder / "sub").mkdir(parents=True)
    gens = {
        "a.csv.gz": ("gz", GENERATORS["stray_quote"](rng)),
        "_2024_reviews.csv": (None, GENERATORS["excel_export"](rng)),
        "sub/b.tsv.zst": ("zstd", GENERATORS["tsv_unclosed_quote"](rng)),
        "c.csv.bz2": ("bz2", GENERATORS["concatenated_exports"](rng)),
        "d.csv.xz": ("xz", GENERATORS["cut_download"](rng)),
    }
    for name, (codec, gen) in gens.items():
        (folder / name).write_bytes(_compress(gen.body, codec) if codec else gen.body)
    stale = folder / ".ipynb_checkpoints" / "a-checkpoint.csv"
    stale.parent.mkdir()
    stale.write_text("text,polarity\nstale copy,1\n")
    (folder / "__MACOSX").mkdir()
    (folder / "__MACOSX" / "._a.csv").write_bytes(b"\x00\x05\x16\x07")
    (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (folder / "._c.csv").write_bytes(b"\x00\x05\x16\x07")
    (folder / "README.md").write_text("about these files")
    (folder / "_SUCCESS").write_text("")

    listing = list_source(str(folder))
    assert sorted(Path(f).relative_to(folder).as_posix() for f in listing.files) == sorted(gens)
    assert sorted(Path(f).relative_to(folder).as_posix() for f in listing.ignored) == sorted(
        [
            ".ipynb_checkpoints/a-checkpoint.csv",
            "__MACOSX/._a.csv",
            ".DS_Store",
            "._c.csv",
            "README.md",
            "_SUCCESS",
        ]
    )
    raw = read_source(SourceSpec(uri=str(folder)))
    result = validate(raw, ValidationRules())
    total = sum(g.rows for _, g in gens.values())
    assert raw.num_rows == total == result.accepted.num_rows + result.rejected.num_rows
    expected = Counter()
    for _, g in gens.values():
        expected.update(g.reasons)
    assert result.reasons == dict(expected)
    assert "stale copy" not in result.accepted.column("text").to_pylist()


@pytest.mark.parametrize(
    "name,error",
    [
        ("reviews.zip", r"archives are not read in source folder .*unpack it"),
        ("reviews.xlsx", r"unsupported file type in source folder"),
    ],
)
def test_folder_with_an_unreadable_file_is_refused_naming_it(tmp_path: Path, name: str, error: str):
    folder = tmp_path / "drop"
    folder.mkdir()
    (folder / "ok.csv").write_text("text,label\ngood,1\n")
    (folder / name).write_bytes(b"PK\x03\x04")
    with pytest.raises(SourceError, match=error) as info:
        read_source(SourceSpec(uri=str(folder)))
    assert str(info.value).startswith(str(folder / name))


def test_cross_file_duplicates_name_the_kept_copy(tmp_path: Path):
    folder = tmp_path / "drop"
    folder.mkdir()
    (folder / "a.csv").write_text("text,label\nsame review,1\nonly in a,1\n")
    (folder / "b.csv").write_text("text,label\nsame review,-1\nonly in b,1\n")
    result = validate(
        read_source(SourceSpec(uri=str(folder))), ValidationRules(duplicate_conflicts="first")
    )
    [row] = result.rejected.to_pylist()
    assert row["reason"] == "conflicting_duplicate" and row["source_file"] == str(folder / "b.csv")
    assert row["detail"] == f"first seen as Positive ({folder / 'a.csv'} line 2, kept)"
    assert result.cross_file_duplicates == {f"{folder / 'a.csv'} <- {folder / 'b.csv'}": 1}


def test_corrupt_compressed_file_names_the_file(tmp_path: Path):
    path = tmp_path / "reviews.csv.gz"
    path.write_bytes(gzip.compress(b"text,label\ngood,1\n")[:-10])
    with pytest.raises(SourceError, match=r"reviews\.csv\.gz: cannot decompress as gzip"):
        read_source(SourceSpec(uri=str(path)))


def test_through_dagster_counts_add_up_and_files_are_listed(
    tmp_path: Path, storage_root: Path, instance
):
    """raw_reviews on a hostile folder: metadata rows_in = generated records; read and ignored
    files listed.
    """
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.defs.versions.register import register_version
    from finetune_assets_tests.defs.data.test_data_assets import _metadata, materialize

    folder = tmp_path / "drop"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    gens = [
        GENERATORS["stray_quote"](random.Random(1)),
        GENERATORS["tsv_unclosed_quote"](random.Random(1)),
    ]
    for g in gens:
        (folder / g.name).write_bytes(g.body)
    (folder / ".ipynb_checkpoints" / "stray_quote-checkpoint.csv").write_text(
        "text,polarity\nstale,1\n"
    )
    register_version(instance, Storage(str(storage_root)), "h1", SourceSpec(uri=str(folder)))
    md = _metadata(materialize(storage_root, instance, ["raw_reviews"], "h1"), "raw_reviews")
    assert (
        md["rows_in"] == sum(g.rows for g in gens) == md["dagster/row_count"] + md["rejected_rows"]
    )
    assert md["malformed_lines"] == sum(g.reasons.get("malformed_row", 0) for g in gens) == 2
    assert sorted(Path(p).name for p in md["files_read"]) == sorted(g.name for g in gens)
    assert list(md["files_ignored"].values()) == ["inside a hidden folder"]


def test_changed_content_under_a_registered_key_is_refused_on_materialization(
    tmp_path: Path, storage_root: Path, instance
):
    """The CLI path records a fingerprint like the sensor; raw_reviews refuses to read other
    content under the key.
    """
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.defs.versions.register import register_version, source_fingerprint
    from finetune_assets_tests.defs.data.test_data_assets import _failure_message, materialize

    path = tmp_path / "reviews.csv"
    path.write_text("text,label\ngood one,1\nbad one,-1\n")
    store = Storage(str(storage_root))
    spec = SourceSpec(uri=str(path))
    register_version(instance, store, "v1", spec, fingerprint=source_fingerprint(spec))
    materialize(storage_root, instance, ["raw_reviews"], "v1")
    first = store.require("raw_reviews", "v1")
    path.write_text("text,label\nsomething else,1\n")
    result = materialize(storage_root, instance, ["raw_reviews"], "v1", raise_on_error=False)
    assert not result.success
    message = _failure_message(result)
    assert (
        "content changed after dataset version v1 was registered" in message
        and "new key" in message
    )
    assert store.require("raw_reviews", "v1").attempt == first.attempt  # nothing new published


def test_parquet_label_and_text_representations_are_read_as_their_values(tmp_path: Path):
    """pandas ``category`` (dictionary), decimal, binary and list labels: the value, never a
    marker.
    """
    import decimal

    import pyarrow.parquet as pq

    texts = ["good one", "bad one", "so so", "listy"]
    table = pa.table(
        {
            "text": pa.array(texts).dictionary_encode(),
            "label": pa.array(["1", "-1", "0", "1"]).dictionary_encode(),
            "decimal_label": pa.array(
                [decimal.Decimal("1.0"), decimal.Decimal("-1"), decimal.Decimal("0"), None]
            ),
            "binary_label": pa.array([b"1", b"-1", b"0", b"\xff"]),
            "list_label": pa.array([[1], [-1], [0], [2]]),
        }
    )
    path = tmp_path / "reviews.parquet"
    pq.write_table(table, path)
    for column, accepted, unknown in (
        ("label", 4, []),
        ("decimal_label", 3, [None]),
        ("binary_label", 3, ["\\xff"]),
        ("list_label", 0, ["[1]", "[-1]", "[0]", "[2]"]),
    ):
        result = validate(
            read_source(SourceSpec(uri=str(path), label_column=column)), ValidationRules()
        )
        assert result.accepted.num_rows == accepted, column
        labels = [r["label"] for r in result.rejected.to_pylist()]
        assert labels == unknown, column
        assert not any("\x00" in (r.get("detail") or "") for r in result.rejected.to_pylist())
    raw = read_source(SourceSpec(uri=str(path)))
    assert raw.column("text").to_pylist() == texts


def test_non_text_column_is_quarantined_with_its_type(tmp_path: Path):
    import pyarrow.parquet as pq

    path = tmp_path / "reviews.parquet"
    pq.write_table(pa.table({"text": pa.array([b"\xff\xfe", b"ok"]), "label": ["1", "1"]}), path)
    result = validate(read_source(SourceSpec(uri=str(path))), ValidationRules())
    assert result.accepted.column("text").to_pylist() == ["ok"]
    [row] = result.rejected.to_pylist()
    assert row["reason"] == "non_text" and row["detail"] == "binary value that is not UTF-8 text"


@pytest.mark.parametrize(
    "encoding,body,hint",
    [
        ("utf-16-le", "text,label\nجيد,1\n", "utf-16"),  # UTF-16 without a byte-order mark
        ("cp1256", "text,label\nok,1\n" * 50 + "خدمة ممتازة جدا والطعام رائع,1\n" * 30, "cp1256"),
    ],
)
def test_wrong_encoding_names_the_line_and_a_likely_encoding(
    tmp_path: Path, encoding: str, body: str, hint: str
):
    path = tmp_path / "reviews.csv"
    path.write_bytes(body.encode(encoding))
    with pytest.raises(SourceError) as info:
        read_source(SourceSpec(uri=str(path)))
    message = str(info.value)
    assert message.startswith(f"{path}: line ") and "not valid utf-8" in message
    assert f"encoding='{hint}'" in message and "--encoding" in message


def test_byte_order_mark_does_not_hide_the_header(tmp_path: Path):
    for bom, enc in (
        (b"\xef\xbb\xbf", "utf-8"),
        (b"\xff\xfe", "utf-16-le"),
        (b"\xfe\xff", "utf-16-be"),
    ):
        path = tmp_path / "bom.csv"
        path.write_bytes(bom + "text,label\nجيد,1\n".encode(enc))
        raw = read_source(SourceSpec(uri=str(path)))
        assert raw.column("text").to_pylist() == ["جيد"]


@pytest.mark.parametrize(
    "body,expect",
    [
        (
            gzip.compress(b"text,label\ngood,1\n"),
            "the file is gzip-compressed, not csv text; add .gz to its name",
        ),
        (b"PK\x03\x04\x14\x00", "a zip archive (or an Excel .xlsx workbook)"),
        (b"PAR1\x15\x04", "a Parquet file, not csv text"),
    ],
)
def test_disguised_file_says_what_it_really_is(tmp_path: Path, body: bytes, expect: str):
    path = tmp_path / "reviews.csv"
    path.write_bytes(body)
    with pytest.raises(SourceError, match=re.escape(expect)):
        read_source(SourceSpec(uri=str(path)))


@pytest.mark.parametrize(
    "delimiter,newline", [(",", "\n"), (",", "\r\n"), ("\t", "\n"), ("\t", "\r\n")]
)
def test_splitter_reads_back_whatever_csv_writer_writes(delimiter: str, newline: str):
    """Any field an RFC 4180 writer can quote (delimiters, quotes, CR, LF, invisible marks) reads
    back exactly, with line spans that add up to the file's lines.
    """
    import csv
    import io

    from finetune_assets.core.sources.delimited import split_records

    rng = random.Random(11)
    # (no lone CR: csv.writer leaves a field ending in CR unquoted, and before LF that reads as CRLF
    # in any reader)
    alphabet = ["a", "ج", " ", ",", "\t", '"', '""', "\n", "\r\n", "\u200f", "x y"]
    rows = [["h1", "h2", "h3"]] + [
        ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) for _ in range(3)]
        for _ in range(300)
    ]
    buf = io.StringIO()
    csv.writer(buf, delimiter=delimiter, lineterminator=newline).writerows(rows)
    text = buf.getvalue()
    recs = split_records(text, delimiter)
    assert recs.header == rows[0] and not recs.bad
    assert [list(r) for r in zip(*recs.columns)] == rows[1:]
    assert recs.end_line[-1] == text.count("\n")  # the last record ends on the file's last line


def test_jsonl_with_broken_lines_quarantines_each_line(tmp_path: Path):
    """A scraper's JSON Lines: a line cut mid-object, a bare list, a number as text, plain
    strings, CRLF.
    """
    import json

    lines = [json.dumps({"review": f"R{i:05d} fine", "sentiment": 1}) for i in range(20)]
    lines[5] = lines[5][:-9]  # cut mid-object
    lines[9] = "[1, 2]"
    lines[12] = json.dumps({"review": 12345, "sentiment": 1})
    lines[15] = json.dumps("R00015 a plain string")  # no label: missing_label
    path = tmp_path / "scraped.jsonl"
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    raw = read_source(SourceSpec(uri=str(path)))
    result = validate(raw, ValidationRules())
    assert raw.num_rows == 20 == result.accepted.num_rows + result.rejected.num_rows
    assert result.reasons == {"malformed_row": 2, "non_text": 1, "missing_label": 1}
    bad = {r["source_line"]: r for r in result.rejected.to_pylist()}
    assert set(bad) == {6, 10, 13, 16} and bad[6]["raw"] == lines[5] and bad[10]["raw"] == "[1, 2]"
