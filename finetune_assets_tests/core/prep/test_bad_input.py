"""Bad input matrix over the real review files and damaged copies of them.

Every case ends in exactly one of two ways:

- ``error``: a :class:`SourceError` whose message names the file and the problem, or
- ``quarantine``: the read succeeds and ``input rows == accepted + rejected``, with the expected
  rejection reasons counted (input rows counted independently of the reader under test).

docs/reliability.md cites these test ids (``test_bad_input[<case>]``,
``test_bad_input_through_dagster[<case>]``).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from finetune_assets.core.prep.validate import ValidationRules, validate
from finetune_assets.core.sources import SourceError, SourceSpec, read_source
from finetune_assets_tests.core.conftest import count_csv_rows, csv_rows


@dataclass
class Case:
    path: Path
    error: str | None = None  # regex the SourceError message must match (besides the file path)
    rows: int | None = None  # input rows, counted independently
    # rejection reasons expected (exact counts)
    reasons: dict[str, int] = field(default_factory=dict)
    spec: dict = field(default_factory=dict)  # SourceSpec overrides
    rules: dict = field(default_factory=dict)  # ValidationRules overrides
    accepted_labels: set[str] | None = None  # classes present among accepted rows


def _write_csv(path: Path, header: list[str], rows: list[list], delimiter: str = ",") -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _prod(src: Path) -> list[list[str]]:
    return [[r["text"], r["polarity"]] for r in csv_rows(src / "PROD.csv")]


def _baseline_reasons(src: Path) -> dict[str, int]:
    """Rejections the untouched PROD.csv already has (it holds a few duplicates)."""
    raw = read_source(SourceSpec(uri=str(src / "PROD.csv")))
    return validate(raw, ValidationRules()).reasons


# -- the cases -------------------------------------------------------------------------------------


def truncated_mid_row(src: Path, tmp: Path) -> Case:
    """PROD.csv cut in the middle of a (single-line) row: the complete rows stay, the stub is
    quarantined.
    """
    text = (src / "PROD.csv").read_text(encoding="utf-8")
    start = text.index("\n", len(text) // 2) + 1
    # an unquoted row with a long text
    while text[start] == '"' or text.index(",", start) - start < 8:
        start = text.index("\n", start) + 1
    cut = text[: start + 6]
    path = tmp / "PROD_truncated.csv"
    path.write_text(cut, encoding="utf-8")
    complete = list(csv.reader(io.StringIO(text[:start], newline="")))[1:]
    return Case(
        path,
        rows=len(complete) + 1,
        reasons={"malformed_row": 1, **_reasons_of(complete, skip=set())},
    )


def truncated_mid_quote(src: Path, tmp: Path) -> Case:
    """ATT.csv cut inside a quoted multi-line review (an interrupted download)."""
    text = (src / "ATT.csv").read_text(encoding="utf-8")
    index = 1000  # the value in the unnamed index column (it has gaps, so not the row count)
    start = text.index(f'\n{index},"') + 1
    cut = text[: start + len(f'{index},"') + 40]
    path = tmp / "ATT_truncated.csv"
    path.write_text(cut, encoding="utf-8")
    complete = [r[1:] for r in csv.reader(io.StringIO(text[:start], newline="")) if r][1:]
    # the unclosed quote runs to the end of the file: each of its physical lines is quarantined on
    # its own (the reader cannot tell a cut download from a stray quote, and must not swallow lines
    # for either)
    stub_lines = cut[start:].count("\n") + 1
    return Case(
        path,
        rows=len(complete) + stub_lines,
        reasons={"malformed_row": stub_lines, **_reasons_of(complete, skip=set())},
    )


def wrong_delimiter(src: Path, tmp: Path) -> Case:
    """A delimiter set wrong (``--delimiter '|'`` on a ``;`` export): the header says which."""
    path = _write_csv(tmp / "PROD_semicolon.csv", ["text", "polarity"], _prod(src), delimiter=";")
    return Case(
        path,
        spec={"delimiter": "|"},
        error=r"no text column found .*columns: \['text;polarity'\].*the header looks "
        r"';'-separated",
    )


def semicolon_export(src: Path, tmp: Path) -> Case:
    """A European spreadsheet's ``;`` CSV: the delimiter is sniffed from the header."""
    path = _write_csv(tmp / "PROD_semicolon.csv", ["text", "polarity"], _prod(src), delimiter=";")
    return Case(path, rows=count_csv_rows(path, delimiter=";"), reasons=_baseline_reasons(src))


def wrong_encoding_cp1256(src: Path, tmp: Path) -> Case:
    path = tmp / "PROD_cp1256.csv"
    path.write_bytes(
        (src / "PROD.csv").read_text(encoding="utf-8").encode("cp1256", errors="replace")
    )
    return Case(
        path,
        error=r"line 2: not valid utf-8 \(byte e3 at offset 14\); set the source encoding, "
        r"e\.g\. encoding='cp1256' \(CLI --encoding cp1256",
    )


def cp1256_with_encoding_set(src: Path, tmp: Path) -> Case:
    path = tmp / "PROD_cp1256.csv"
    path.write_bytes(
        (src / "PROD.csv").read_text(encoding="utf-8").encode("cp1256", errors="replace")
    )
    return Case(
        path,
        spec={"encoding": "cp1256"},
        rows=count_csv_rows(path, encoding="cp1256"),
        reasons=_baseline_reasons(src),
    )


def unknown_encoding_name(src: Path, tmp: Path) -> Case:
    path = tmp / "PROD.csv"
    path.write_bytes((src / "PROD.csv").read_bytes())
    return Case(
        path, spec={"encoding": "cp-nonexistent"}, error=r"unknown encoding 'cp-nonexistent'"
    )


def missing_text_column(src: Path, tmp: Path) -> Case:
    # "body" is found
    path = _write_csv(tmp / "PROD_opinion.csv", ["opinion", "polarity"], _prod(src))
    return Case(
        path,
        error=r"no text column found \(looked for text, review, content, sentence, .*; "
        r"columns: \['opinion', 'polarity'\]\); set text_column",
    )


def configured_text_column_absent(src: Path, tmp: Path) -> Case:
    path = tmp / "PROD.csv"
    path.write_bytes((src / "PROD.csv").read_bytes())
    return Case(path, spec={"text_column": "review_body"}, error=r"no text column 'review_body'")


def missing_label_column(src: Path, tmp: Path) -> Case:
    path = _write_csv(tmp / "PROD_nolabel.csv", ["text"], [[r[0]] for r in _prod(src)])
    return Case(path, error=r"no label column found")


def empty_file(src: Path, tmp: Path) -> Case:
    path = tmp / "empty.csv"
    path.write_bytes(b"")
    return Case(path, error=r"file is empty")


def whitespace_only_file(src: Path, tmp: Path) -> Case:
    path = tmp / "blank.csv"
    path.write_bytes(b"\n \n\t\n")
    return Case(path, error=r"file is empty")


def header_only(src: Path, tmp: Path) -> Case:
    path = tmp / "header.csv"
    path.write_text("text,polarity\n", encoding="utf-8")
    return Case(path, rows=0)


def labels_outside_mapping(src: Path, tmp: Path) -> Case:
    rows = _prod(src)
    for i in range(0, 300, 3):
        rows[i][1] = ["2", "5", "great", "1.5"][i % 4]
    path = _write_csv(tmp / "PROD_badlabels.csv", ["text", "polarity"], rows)
    base = _baseline_reasons(src)
    return Case(path, rows=len(rows), reasons={"unknown_label": 100, **base})


def nan_and_empty_texts(src: Path, tmp: Path) -> Case:
    rows = _prod(src)
    blanks = ["", "   ", "NaN", "\n\t", "null"]
    for i in range(50):
        rows[i * 7][0] = blanks[i % len(blanks)]
    path = _write_csv(tmp / "PROD_blanks.csv", ["text", "polarity"], rows)
    # PROD's own duplicates sit past these rows, except those the blanked rows erased
    out = validate(read_source(SourceSpec(uri=str(path))), ValidationRules())
    dups = out.reasons.get("duplicate", 0) + out.reasons.get("conflicting_duplicate", 0)
    assert dups <= sum(_baseline_reasons(src).values())
    return Case(
        path,
        rows=len(rows),
        reasons={"empty_text": 50, **{k: v for k, v in out.reasons.items() if k != "empty_text"}},
    )


def extremely_long_texts(src: Path, tmp: Path) -> Case:
    rows = _prod(src)[:500]
    for i in range(0, 50, 5):
        # > 20,000 characters
        rows[i][0] = (rows[i][0] + " ") * (25_000 // max(1, len(rows[i][0])) + 1)
    rows[1][0] = "x" * 1_000_000  # one megabyte in one cell
    path = _write_csv(tmp / "PROD_long.csv", ["text", "polarity"], rows)
    n = len(rows)
    return Case(
        path,
        rows=n,
        reasons={
            "too_long": 11,
            **_reasons_of(rows[:], skip={0, 1, 5, 10, 15, 20, 25, 30, 35, 40, 45}),
        },
    )


def _reasons_of(rows: list[list[str]], skip: set[int]) -> dict[str, int]:
    """Duplicates among rows (those not otherwise rejected), computed independently of validate():
    copies with one label are duplicates; with different labels the majority (3+ copies, more than
    half) keeps one copy, else every copy is a conflicting_duplicate (docs/reliability.md).
    """
    from collections import Counter

    from finetune_assets.core.prep.validate import normalize_text

    groups: dict[str, list[str]] = {}
    for i, (text, label) in enumerate(rows):
        if i in skip or not text.strip():
            continue
        groups.setdefault(normalize_text(text), []).append(label)
    out: Counter = Counter()
    for labels in groups.values():
        counts = Counter(labels)
        top, n = counts.most_common(1)[0]
        if len(counts) == 1:
            out["duplicate"] += n - 1
        elif len(labels) >= 3 and 2 * n > len(labels):
            out["duplicate"] += n - 1
            out["conflicting_duplicate"] += len(labels) - n
        else:
            out["conflicting_duplicate"] += len(labels)
    return {k: v for k, v in out.items() if v}


def duplicated_rows(src: Path, tmp: Path) -> Case:
    rows = _prod(src)
    extra = [list(r) for r in rows[:400]]
    path = _write_csv(tmp / "PROD_dup.csv", ["text", "polarity"], rows + extra)
    expected = _reasons_of(rows + extra, skip=set())
    assert expected.get("duplicate", 0) >= 400 - 10
    return Case(path, rows=len(rows) + 400, reasons=expected)


def single_class_only(src: Path, tmp: Path) -> Case:
    rows = [
        [r[""], r["text"], r["polarity"]]
        for r in csv_rows(src / "ATT.csv")
        if r["polarity"] == "1.0"
    ]
    path = _write_csv(tmp / "ATT_positive.csv", ["", "text", "polarity"], rows)
    return Case(path, rows=len(rows), reasons={}, accepted_labels={"Positive"})


def parquet_wrong_schema(src: Path, tmp: Path) -> Case:
    rows = _prod(src)
    path = tmp / "wrong_schema.parquet"
    pq.write_table(
        pa.table({"remark": [r[0] for r in rows], "grade": [int(r[1]) for r in rows]}), path
    )
    # comment/stars are found
    return Case(path, error=r"no text column found .*columns: \['remark', 'grade'\]")


def parquet_list_text_column(src: Path, tmp: Path) -> Case:
    rows = _prod(src)[:200]
    path = tmp / "list_text.parquet"
    pq.write_table(
        pa.table({"text": [[len(r[0]), 1] for r in rows], "label": [int(r[1]) for r in rows]}), path
    )
    return Case(path, rows=200, reasons={"non_text": 200})


def parquet_int_text_column(src: Path, tmp: Path) -> Case:
    path = tmp / "int_text.parquet"
    pq.write_table(pa.table({"text": list(range(100)), "label": [1] * 100}), path)
    return Case(path, rows=100, reasons={"non_text": 100})


def parquet_float_labels_with_nan(src: Path, tmp: Path) -> Case:
    rows = _prod(src)
    labels = [float(r[1]) for r in rows]
    for i in range(0, 100, 2):
        labels[i] = float("nan")
    path = tmp / "nan_labels.parquet"
    pq.write_table(pa.table({"review": [r[0] for r in rows], "sentiment": labels}), path)
    base = _reasons_of([[t, lab] for (t, _), lab in zip(rows, labels)], skip=set(range(0, 100, 2)))
    return Case(path, rows=len(rows), reasons={"missing_label": 50, **base})


def parquet_corrupt(src: Path, tmp: Path) -> Case:
    path = tmp / "reviews.parquet"
    path.write_bytes((src / "PROD.csv").read_bytes()[:5000])
    return Case(path, error=r"cannot read as parquet: .*magic bytes")


def jsonl_variant(src: Path, tmp: Path) -> Case:
    rows = _prod(src)
    path = tmp / "PROD.jsonl"
    path.write_text(
        "".join(
            json.dumps({"review": t, "polarity": int(p)}, ensure_ascii=False) + "\n"
            for t, p in rows
        ),
        encoding="utf-8",
    )
    return Case(path, rows=len(rows), reasons=_baseline_reasons(src))


def jsonl_truncated(src: Path, tmp: Path) -> Case:
    rows = _prod(src)[:300]
    body = "".join(
        json.dumps({"text": t, "label": int(p)}, ensure_ascii=False) + "\n" for t, p in rows
    )
    path = tmp / "cut.jsonl"
    path.write_text(body[: len(body) - 25], encoding="utf-8")
    # the cut last line is quarantined with its line number; the 299 complete lines are read
    return Case(path, rows=300, reasons={"malformed_row": 1, **_reasons_of(rows[:299], skip=set())})


def jsonl_mixed_types(src: Path, tmp: Path) -> Case:
    path = tmp / "mixed.jsonl"
    path.write_text(
        json.dumps({"text": "جيد", "label": 1}) + "\n" + json.dumps({"text": 5, "label": 1}) + "\n",
        encoding="utf-8",
    )
    # the number is quarantined, the review is read
    return Case(path, rows=2, reasons={"non_text": 1})


def tsv_variant(src: Path, tmp: Path) -> Case:
    rows = _prod(src)
    path = _write_csv(tmp / "PROD.tsv", ["text", "polarity"], rows, delimiter="\t")
    assert count_csv_rows(path, delimiter="\t") == len(rows)
    return Case(path, rows=len(rows), reasons=_baseline_reasons(src))


def unsupported_extension(src: Path, tmp: Path) -> Case:
    path = tmp / "reviews.xlsx"
    path.write_bytes(b"PK\x03\x04")
    return Case(path, error=r"unsupported file type")


def missing_file(src: Path, tmp: Path) -> Case:
    return Case(tmp / "does_not_exist.csv", error=r"no such file or folder")


CASES: dict[str, Callable[[Path, Path], Case]] = {
    f.__name__: f
    for f in (
        truncated_mid_row,
        truncated_mid_quote,
        wrong_delimiter,
        semicolon_export,
        wrong_encoding_cp1256,
        cp1256_with_encoding_set,
        unknown_encoding_name,
        missing_text_column,
        configured_text_column_absent,
        missing_label_column,
        empty_file,
        whitespace_only_file,
        header_only,
        labels_outside_mapping,
        nan_and_empty_texts,
        extremely_long_texts,
        duplicated_rows,
        single_class_only,
        parquet_wrong_schema,
        parquet_list_text_column,
        parquet_int_text_column,
        parquet_float_labels_with_nan,
        parquet_corrupt,
        jsonl_variant,
        jsonl_truncated,
        jsonl_mixed_types,
        tsv_variant,
        unsupported_extension,
        missing_file,
    )
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name: str, arabic_reviews: Path, tmp_path: Path):
    case = CASES[name](arabic_reviews, tmp_path)
    spec = SourceSpec(uri=str(case.path), **case.spec)
    if case.error is not None:
        with pytest.raises(SourceError) as info:
            read_source(spec)
        message = str(info.value)
        assert message.startswith(str(case.path)), message  # names the file first
        assert re.search(case.error, message, flags=re.S), message
        return
    raw = read_source(spec)
    result = validate(raw, ValidationRules(**case.rules))
    assert raw.num_rows == case.rows
    assert result.accepted.num_rows + result.rejected.num_rows == case.rows  # nothing silently lost
    assert result.reasons == case.reasons
    assert set(result.rejected.column("source_file").to_pylist()) <= {str(case.path)}
    if case.accepted_labels is not None:
        assert {k for k, v in result.label_counts.items() if v} == case.accepted_labels
    # rejected rows always say why; accepted rows are non-empty text with a known class
    assert None not in result.rejected.column("reason").to_pylist()
    assert all(t and t.strip() for t in result.accepted.column("text").to_pylist())


@pytest.mark.parametrize(
    "name",
    [
        "wrong_delimiter",
        "missing_text_column",
        "truncated_mid_quote",
        "labels_outside_mapping",
        "parquet_list_text_column",
    ],
)
def test_bad_input_through_dagster(
    name: str, arabic_reviews: Path, tmp_path: Path, storage_root: Path, instance
):
    """The same cases through ``raw_reviews``: a Failure naming file + problem and nothing
    published, or a published quarantine whose metadata counts add up to the input rows.
    """
    from finetune_assets.core.io.storage import ATTEMPTS, Storage
    from finetune_assets.defs.versions.register import register_version
    from finetune_assets_tests.defs.data.test_data_assets import (
        _failure_message,
        _metadata,
        materialize,
    )

    case = CASES[name](arabic_reviews, tmp_path)
    store = Storage(str(storage_root))
    register_version(instance, store, "bad-input", SourceSpec(uri=str(case.path), **case.spec))
    result = materialize(storage_root, instance, ["raw_reviews"], "bad-input", raise_on_error=False)
    attempts = storage_root / "raw_reviews" / "bad-input" / ATTEMPTS
    if case.error is not None or case.reasons.get("non_text") == case.rows:
        assert not result.success
        message = _failure_message(result)
        assert str(case.path) in message
        if case.error is not None:
            assert re.search(case.error, message, flags=re.S), message
        else:  # every row quarantined: the failure says why, with the counts
            assert "no valid reviews" in message and "non_text" in message
        assert store.current("raw_reviews", "bad-input") is None
        assert not attempts.exists() or not any(attempts.iterdir())
        return
    assert result.success
    md = _metadata(result, "raw_reviews")
    assert md["rows_in"] == case.rows == md["dagster/row_count"] + md["rejected_rows"]
    assert md["rejected_by_reason"] == case.reasons
    published = store.require("raw_reviews", "bad-input")
    rejected = pq.read_table(Path(published.url) / "rejected.parquet")
    accepted = pq.read_table(Path(published.url) / "reviews.parquet")
    assert rejected.num_rows + accepted.num_rows == case.rows
