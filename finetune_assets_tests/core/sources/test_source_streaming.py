"""Streaming one large source file in bounded blocks: the blocks, concatenated, equal the whole-file
read row for row, whatever the block size; and memory is bounded by the block, not the file.

Tiny block sizes put block boundaries inside quoted multi-line fields, CRLF pairs, byte-order marks'
neighbours and multi-byte characters. (The first block is at least HEAD_BYTES, so files are larger.)
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import random
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from finetune_assets.core.prep.validate import ValidationRules, validate
from finetune_assets.core.sources import (
    HEAD_BYTES,
    MAX_RECORD_BLOCKS,
    RAW_SCHEMA,
    SourceError,
    SourceSpec,
    iter_file,
    iter_source,
    read_file,
    read_source,
)

BLOCKS = (7, 61, 300)  # bytes: boundaries fall everywhere


def assert_streams_like_whole(path: Path, block: int, min_blocks: int = 3, **spec) -> pa.Table:
    """Streamed with ``block`` equals the whole-file read (all RAW_SCHEMA columns); returns the
    whole read.
    """
    spec = SourceSpec(uri=str(path), **spec)
    whole = read_file(str(path), spec)
    blocks = list(iter_file(str(path), spec, block_bytes=block))
    assert len(blocks) >= min_blocks, "the file must really be streamed in several blocks"
    assert all(t.schema == RAW_SCHEMA for t in blocks)
    assert pa.concat_tables(blocks).to_pylist() == whole.to_pylist()
    return whole


def _messy_rows(n: int, seed: int = 3) -> list[list[str]]:
    rng = random.Random(seed)
    alphabet = ["a", "ج", "😀", "é", " ", ",", "\t", '"', "\n", "\r\n", "x y", "great", "خدمة"]
    return [["text", "label"]] + [
        [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))),
            rng.choice(["positive", "negative"]),
        ]
        for _ in range(n)
    ]


def _write_csv(
    path: Path,
    rows,
    newline: str = "\n",
    delimiter: str = ",",
    encoding: str = "utf-8",
    bom: bool = False,
) -> bytes:
    buf = io.StringIO()
    csv.writer(
        buf, delimiter=delimiter, lineterminator=newline, quoting=csv.QUOTE_MINIMAL
    ).writerows(rows)
    data = (b"\xef\xbb\xbf" if bom else b"") + buf.getvalue().encode(encoding)
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("newline,bom", [("\n", False), ("\r\n", True)])
def test_csv_multiline_quoted_fields_crlf_bom_multibyte(
    tmp_path: Path, block: int, newline: str, bom: bool
):
    """Quoted newlines, CRLF, a BOM and 2-4 byte characters all straddle block boundaries."""
    rows = _messy_rows(400)
    path = tmp_path / "messy.csv"
    data = _write_csv(path, rows, newline, bom=bom)
    assert len(data) > 2 * HEAD_BYTES
    whole = assert_streams_like_whole(path, block)
    # csv.writer's output is all good rows
    assert whole.column("malformed").null_count == whole.num_rows
    assert [[r["text"], r["label"]] for r in whole.to_pylist()] == rows[1:]
    assert whole.column("source_line_end").to_pylist()[-1] == data.count(b"\n")


@pytest.mark.parametrize("block", BLOCKS)
def test_multibyte_character_split_by_a_boundary(tmp_path: Path, block: int):
    """Every boundary of a 1-byte-step file cuts some 4-byte emoji: it still decodes whole."""
    body = "text,label\n" + "".join(f"{'😀' * (i % 5)}ج{i},positive\n" for i in range(2000))
    path = tmp_path / "emoji.csv"
    path.write_text(body, encoding="utf-8")
    whole = assert_streams_like_whole(path, block)
    assert whole.column("text").to_pylist()[7] == "😀😀ج7"


def _malformed_csv(tail: str) -> str:
    rng = random.Random(5)
    parts = ["text,label\n"]
    for i in range(600):
        kind = rng.randrange(9)
        parts.append(
            f'stray "quote {i},positive\n'
            if kind == 0
            # quote inside an unquoted field
            else f'"closed" then text {i},negative\n'
            if kind == 1
            # text after the closing quote
            else f"too,many,fields {i},positive\n"
            if kind == 2
            else f"one field only {i}\n"
            if kind == 3
            else "\n\n"
            if kind == 4
            # blank lines
            else f'"multi\nline\n{i}",negative\n'
            if kind == 5
            else f'"say ""hi"" {i}",positive\r\n'
            if kind == 6
            else f"plain review {i},positive\n"
        )
    return "".join(parts) + tail


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize(
    "tail",
    [
        'last,positive\n"an unclosed quote at the end,negative\nmore,positive\nand more,negative\n',
        'last,positive\nopens "a quote, then,"closes\nlater,positive\n',
        "no newline at the end,positive",
    ],
)
def test_malformed_records_stray_quotes_field_counts_unclosed_quote(
    tmp_path: Path, block: int, tail: str
):
    """Bad records are quarantined with the same record numbers, lines and raw text as a
    whole-file read.
    """
    path = tmp_path / "bad.csv"
    path.write_text(_malformed_csv(tail), encoding="utf-8")
    whole = assert_streams_like_whole(path, block)
    assert whole.column("malformed").null_count < whole.num_rows
    assert whole.column("source_row").to_pylist() == list(range(whole.num_rows))


@pytest.mark.parametrize("block", BLOCKS)
def test_tsv(tmp_path: Path, block: int):
    path = tmp_path / "reviews.tsv"
    _write_csv(path, _messy_rows(300, seed=8), "\r\n", delimiter="\t")
    assert_streams_like_whole(path, block)


@pytest.mark.parametrize("block", [61, 300])
def test_utf16_with_bom_and_a_legacy_encoding(tmp_path: Path, block: int):
    """Two-byte code units split by odd block sizes; a single-byte legacy encoding from the spec."""
    rows = _messy_rows(300, seed=9)
    path = tmp_path / "utf16.csv"
    _write_csv(path, rows, "\r\n", encoding="utf-16")  # Python writes the BOM
    assert [
        [r["text"], r["label"]] for r in assert_streams_like_whole(path, block).to_pylist()
    ] == rows[1:]
    path = tmp_path / "arabic.csv"
    path.write_bytes(
        "".join(f"خدمة ممتازة {i},positive\n" for i in range(1500))
        .join(["text,label\n", ""])
        .encode("cp1256")
    )
    assert_streams_like_whole(path, block, encoding="cp1256")


def test_classic_mac_line_ends(tmp_path: Path):
    path = tmp_path / "mac.csv"
    path.write_bytes(
        ("text,label\r" + "".join(f"review {i},positive\r" for i in range(1500))).encode()
    )
    assert assert_streams_like_whole(path, 61).num_rows == 1500


def test_decode_error_names_the_same_line(tmp_path: Path):
    path = tmp_path / "latin.csv"
    path.write_bytes(
        ("text,label\n" + "".join(f"review {i},positive\n" for i in range(3000))).encode()
        + "café,positive\n".encode("cp1252")
    )
    spec = SourceSpec(uri=str(path))
    with pytest.raises(SourceError) as whole:
        read_file(str(path), spec)
    with pytest.raises(SourceError) as streamed:
        list(iter_file(str(path), spec, block_bytes=61))
    assert "line 3002: not valid utf-8 (byte e9 at offset" in str(whole.value)
    assert str(streamed.value).split(";")[0] == str(whole.value).split(";")[0]


@pytest.mark.parametrize(
    "suffix,compress",
    [
        (".gz", gzip.compress),
        (".bz2", bz2.compress),
        (".xz", lzma.compress),
        (".zst", lambda b: _zstd(b)),
    ],
)
def test_compressed_csv_is_decompressed_as_a_stream(tmp_path: Path, suffix: str, compress):
    plain = tmp_path / "plain.csv"
    _write_csv(plain, _messy_rows(400, seed=4), "\r\n")
    path = tmp_path / f"reviews.csv{suffix}"
    path.write_bytes(compress(plain.read_bytes()))
    streamed = assert_streams_like_whole(path, 300)
    assert streamed.drop_columns(["source_file"]).equals(
        read_file(str(plain), SourceSpec(uri=str(plain))).drop_columns(["source_file"])
    )


def _zstd(data: bytes) -> bytes:
    out = pa.BufferOutputStream()
    with pa.CompressedOutputStream(out, "zstd") as f:
        f.write(data)
    return out.getvalue().to_pybytes()


@pytest.mark.parametrize("block", BLOCKS)
def test_jsonl_with_a_bad_line_blank_lines_and_bom(tmp_path: Path, block: int):
    lines = [
        json.dumps({"review": f"R{i:05d} fine ج", "sentiment": i % 2}, ensure_ascii=False)
        for i in range(400)
    ]
    lines[57] = lines[57][:-9]  # cut mid-object
    lines[120] = "[1, 2]"
    lines[200] = json.dumps("a plain string")
    lines[300] = ""
    path = tmp_path / "reviews.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + ("\r\n".join(lines) + "\r\n").encode())
    whole = assert_streams_like_whole(path, block)
    assert whole.num_rows == 399
    bad = {r["source_line"]: r["raw"] for r in whole.to_pylist() if r["malformed"]}
    assert bad == {58: lines[57], 121: "[1, 2]"}


def test_jsonl_columns_missing_from_a_later_block(tmp_path: Path):
    """Later blocks without the label key still find the first block's label column (null there)."""
    lines = [json.dumps({"text": f"review {i}", "label": "positive"}) for i in range(200)]
    lines += [json.dumps({"text": f"unlabelled {i}"}) for i in range(200)]
    path = tmp_path / "sparse.jsonl"
    path.write_text("\n".join(lines) + "\n")
    whole = assert_streams_like_whole(path, 300)
    assert whole.column("label").null_count == 200


@pytest.mark.parametrize("block", [1024, 3 * 1024, 1 << 20])
def test_parquet_in_batches_over_several_row_groups(tmp_path: Path, block: int):
    table = pa.table(
        {"review": [f"review {i}" for i in range(100)], "stars": [float(i % 5) for i in range(100)]}
    )
    path = tmp_path / "reviews.parquet"
    pq.write_table(table, path, row_group_size=7)
    assert pq.ParquetFile(path).num_row_groups == 15
    whole = assert_streams_like_whole(path, block, min_blocks=1 if block == 1 << 20 else 3)
    assert whole.column("source_row").to_pylist() == list(range(100))
    assert whole.column("label").to_pylist()[:3] == ["0", "1", "2"]


def test_a_quote_never_closed_is_not_carried_without_limit(tmp_path: Path):
    """A stray opening quote with no closing quote anywhere after it: the carried text stops growing
    at MAX_RECORD_BLOCKS blocks; its first line is quarantined as a whole-file read does, and rows
    add up.
    """
    body = 'text,label\nfine,positive\n"never closed,negative\n' + "".join(
        f"review {i},positive\n" for i in range(MAX_RECORD_BLOCKS * HEAD_BYTES // 10)
    )
    path = tmp_path / "stray.csv"
    path.write_text(body)
    whole = assert_streams_like_whole(path, 300)
    bad = whole.filter(whole.column("malformed").is_valid()).to_pylist()
    assert [(b["source_line"], b["raw"]) for b in bad] == [(3, '"never closed,negative')]
    result = validate(whole, ValidationRules())
    assert (
        whole.num_rows
        == body.count("\n") - 1
        == result.accepted.num_rows + result.rejected.num_rows
    )


def test_one_line_longer_than_the_limit_is_an_error(tmp_path: Path):
    path = tmp_path / "long.csv"
    path.write_text("text,label\n" + "x" * (MAX_RECORD_BLOCKS * HEAD_BYTES + 1000) + ",positive\n")
    with pytest.raises(SourceError, match=r"long\.csv: line 2: no line end within"):
        list(iter_file(str(path), SourceSpec(uri=str(path)), block_bytes=300))
    # a whole-file block reads it
    assert read_file(str(path), SourceSpec(uri=str(path))).num_rows == 1


def test_iter_source_streams_every_file_of_a_folder(tmp_path: Path):
    _write_csv(tmp_path / "a.csv", _messy_rows(300))
    (tmp_path / "b.jsonl").write_text(
        "".join(json.dumps({"text": f"r{i}", "label": "positive"}) + "\n" for i in range(300))
    )
    spec = SourceSpec(uri=str(tmp_path))
    blocks = list(iter_source(spec, block_bytes=61))
    assert len(blocks) > 10
    assert pa.concat_tables(blocks).equals(read_source(spec))
    assert read_source(spec).num_rows == 600


def test_read_file_and_samples(tmp_path: Path):
    path = tmp_path / "r.csv"
    _write_csv(path, _messy_rows(300))
    spec = SourceSpec(uri=str(path))
    assert read_source(spec).equals(read_file(str(path), spec))
    sample = read_file(str(path), spec, max_bytes=2000)
    assert 0 < sample.num_rows < 300


def test_memory_is_bounded_by_the_block_not_the_file(tmp_path: Path):
    """A ~9 MB CSV read in 256 KB blocks: Python's peak allocation stays far below the file size
    (about 2.6 MB: parsed rows cost ~10x their bytes; a whole-file read peaks near 7x the file).
    """
    path = tmp_path / "big.csv"
    row = '"a review, with a comma\nand a second line {i}",positive\n'
    with path.open("w") as f:
        f.write("text,label\n")
        for start in range(0, 160_000, 10_000):
            f.write("".join(row.format(i=i) for i in range(start, start + 10_000)))
    size = path.stat().st_size
    assert size > 9_000_000
    # lazy imports happen outside the peak
    list(iter_file(str(path), SourceSpec(uri=str(path)), max_bytes=1000))
    rows = 0
    tracemalloc.start()
    try:
        for table in iter_file(str(path), SourceSpec(uri=str(path)), block_bytes=1 << 18):
            rows += table.num_rows
            del table
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == 160_000
    assert peak < size / 2, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB file"
