"""Read one dataset version from its source into a raw table, naming the file and the problem on failure.

A source is a file or folder of CSV / TSV / JSONL / Parquet (local path or fsspec URL), a
Hugging Face dataset id (``hf:owner/name``), or the built-in sample (``builtin:sample``).
Every row read is kept: rows the parser cannot split are returned too, flagged ``malformed``,
so that validation can quarantine them and the counts always add up.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from finetune_assets.data.sample import SAMPLE_SOURCE, make_sample_reviews

HF_PREFIX = "hf:"
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
# Column names looked for, in order; a file's names are compared lower-cased with spaces/dashes as "_".
TEXT_COLUMNS = ("text", "review", "content", "sentence", "review_text", "reviewtext", "review_body", "body",
                "comment", "comments", "review_content", "text_review", "feedback", "verified_reviews")
LABEL_COLUMNS = ("label", "polarity", "sentiment", "rating_class", "labels", "class", "rating", "stars",
                 "star_rating", "score", "overall", "review_score")
# Several text columns (text_column "Title,Review Text"): joined in that order into one review text,
# empty parts skipped, separated by this, so dedup, the split hash, the gate and predict see one string.
TEXT_JOIN = "\n"

# Columns of the raw table handed to validation.
RAW_SCHEMA = pa.schema([
    ("text", pa.string()),
    ("label", pa.string()),
    ("source_file", pa.string()),
    ("source_row", pa.int64()),
    ("malformed", pa.string()),  # parser error for rows that could not be split into columns
])


class SourceError(ValueError):
    """A source that cannot be read: the message names the file and what is wrong."""


@dataclass(frozen=True)
class SourceSpec:
    uri: str
    revision: str | None = None  # Hugging Face dataset revision
    hf_split: str = "train"
    text_column: str | None = None  # None: first of TEXT_COLUMNS present; "title,body": joined (TEXT_JOIN)
    label_column: str | None = None  # None: first of LABEL_COLUMNS present
    encoding: str = "utf-8"


def list_files(uri: str) -> list[str]:
    """The data files of a source: the file itself, or the supported files under a folder (sorted)."""
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.exists(path):
        raise SourceError(f"{uri}: no such file or folder")
    if fs.isdir(path):
        files = sorted(
            p for p in fs.find(path)
            if _format(p) and not p.rsplit("/", 1)[-1].startswith(("_", "."))
        )
        if not files:
            raise SourceError(f"{uri}: folder holds no {', '.join(sorted(FORMATS))} files")
        protocol = uri.split("://", 1)[0] + "://" if "://" in uri else ""
        return [protocol + f if protocol and "://" not in f else f for f in files]
    if not _format(path):
        raise SourceError(f"{uri}: unsupported file type (expected one of {', '.join(sorted(FORMATS))})")
    return [uri]


def _format(path: str) -> str | None:
    for ext, fmt in FORMATS.items():
        if path.lower().endswith(ext):
            return fmt
    return None


def read_source(spec: SourceSpec) -> pa.Table:
    """All rows of a source as :data:`RAW_SCHEMA` (labels as strings, exactly as found)."""
    if spec.uri == SAMPLE_SOURCE:
        table = make_sample_reviews()
        return _to_raw(table, "text", "label", SAMPLE_SOURCE)
    if spec.uri.startswith(HF_PREFIX):
        return _read_hf(spec)
    tables = [_read_file(path, spec) for path in list_files(spec.uri)]
    return pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()


def _read_file(path: str, spec: SourceSpec) -> pa.Table:
    fmt = _format(path)
    with fsspec.open(path, "rb") as f:
        data = f.read()
    if not data.strip():
        raise SourceError(f"{path}: file is empty")
    bad_rows: list[tuple[int | None, str]] = []
    try:
        if fmt in ("csv", "tsv"):
            table = _read_delimited(data, fmt, spec.encoding, bad_rows)
        elif fmt == "jsonl":
            table = pajson.read_json(io.BytesIO(data))
        else:
            table = pq.read_table(io.BytesIO(data))
    except pa.ArrowInvalid as err:
        hint = ""
        if "UTF8" in str(err) or "utf8" in str(err).lower():
            hint = " (not valid UTF-8: set the source encoding, e.g. encoding='cp1256')"
        raise SourceError(f"{path}: cannot read as {fmt}: {err}{hint}") from err
    except UnicodeDecodeError as err:
        raise SourceError(f"{path}: cannot decode with encoding {spec.encoding!r}: {err}") from err
    except LookupError as err:  # an encoding name Python does not know
        raise SourceError(f"{path}: unknown encoding {spec.encoding!r}: {err}") from err
    table, text_col = _text_columns(table, spec.text_column, path)
    label_col = _pick(table, spec.label_column, LABEL_COLUMNS, "label", path)
    raw = _to_raw(table, text_col, label_col, path)
    if bad_rows:
        raw = pa.concat_tables([raw, pa.table({
            "text": pa.array([None] * len(bad_rows), pa.string()),
            "label": pa.array([None] * len(bad_rows), pa.string()),
            "source_file": [path] * len(bad_rows),
            "source_row": pa.array([r for r, _ in bad_rows], pa.int64()),
            "malformed": [msg for _, msg in bad_rows],
        }, schema=RAW_SCHEMA)])
    return raw


def _read_delimited(data: bytes, fmt: str, encoding: str, bad_rows: list) -> pa.Table:
    def on_invalid(row) -> str:
        bad_rows.append((row.number, f"expected {row.expected_columns} columns, got {row.actual_columns}"))
        return "skip"  # kept in bad_rows and re-added as a malformed row: nothing is lost

    read_options = pacsv.ReadOptions(encoding=encoding, block_size=64 << 20)
    parse_options = pacsv.ParseOptions(
        delimiter="\t" if fmt == "tsv" else ",",
        newlines_in_values=True,
        invalid_row_handler=on_invalid,
    )
    # Every column as text: labels such as 1 / 1.0 / "positive" are mapped later, explicitly, a review
    # "4.50" stays "4.50", and bytes that do not decode fail here with an encoding error instead of
    # turning into a binary column. The header is read first (a small probe) to name the columns.
    probe = pacsv.open_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(encoding=encoding, block_size=1 << 20),
        parse_options=pacsv.ParseOptions(delimiter=parse_options.delimiter, newlines_in_values=True,
                                         invalid_row_handler=lambda row: "skip"),
    )
    names = probe.schema.names
    return pacsv.read_csv(
        io.BytesIO(data),
        read_options=read_options,
        parse_options=parse_options,
        convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                             strings_can_be_null=True, auto_dict_encode=False),
    )


def _text_columns(table: pa.Table, wanted: str | None, path: str) -> tuple[pa.Table, str]:
    """The text column, or several (``"title,body"``) joined into one (TEXT_JOIN) named ``"\x00text"``."""
    if wanted is None or wanted in table.column_names or "," not in wanted:
        return table, _pick(table, wanted, TEXT_COLUMNS, "text", path)
    cols = [_pick(table, w.strip(), TEXT_COLUMNS, "text", path) for w in wanted.split(",") if w.strip()]
    parts = [_text_column(table.column(c)).to_pylist() for c in cols]
    joined = []
    for values in zip(*parts):
        if any(v is not None and v.startswith("\x00non-text:") for v in values):
            joined.append(next(v for v in values if v is not None and v.startswith("\x00non-text:")))
            continue
        present = [v.strip() for v in values if v is not None and v.strip()]
        joined.append(TEXT_JOIN.join(present) if present else None)
    return table.append_column("\x00text", pa.array(joined, pa.string())), "\x00text"


def _column_key(name: str) -> str:
    return "_".join(name.lower().replace("-", " ").split())


def _pick(table: pa.Table, wanted: str | None, candidates: tuple[str, ...], role: str, path: str) -> str:
    names = table.column_names
    if wanted is not None:
        if wanted not in names:
            raise SourceError(f"{path}: no {role} column {wanted!r} (columns: {names})")
        return wanted
    lowered = {_column_key(n): n for n in reversed(names)}  # the first of equal keys wins
    for c in candidates:
        if c in lowered:
            return lowered[c]
    raise SourceError(
        f"{path}: no {role} column found (looked for {', '.join(candidates)}; columns: {names}); "
        f"set {role}_column in the raw_reviews config"
    )


def _as_string(col: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.cast(pa.string())
    if pa.types.is_floating(col.type):  # 1.0 -> "1", keeping NaN as null
        import pyarrow.compute as pc

        col = pc.if_else(pc.is_nan(col), None, col)
        as_int = pc.equal(col, pc.floor(col))
        return pc.if_else(as_int, col.cast(pa.int64(), safe=False).cast(pa.string()), col.cast(pa.string()))
    if pa.types.is_integer(col.type) or pa.types.is_boolean(col.type):
        return col.cast(pa.string())
    # lists, structs, binary ...: not text; keep a readable form so validation can reject it by reason
    return pa.chunked_array([pa.array([None if v is None else f"\x00non-text:{type(v).__name__}"
                                       for v in col.to_pylist()], pa.string())])


def _text_column(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """Reviews must be text: a typed non-string column (numbers, lists ...) is flagged for quarantine."""
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.cast(pa.string())
    if pa.types.is_null(col.type):
        return pa.chunked_array([pa.nulls(len(col), pa.string())])
    return pa.chunked_array([pa.array([None if v is None else f"\x00non-text:{col.type}"
                                       for v in col.to_pylist()], pa.string())])


def _to_raw(table: pa.Table, text_col: str, label_col: str, source: str) -> pa.Table:
    n = table.num_rows
    return pa.table({
        "text": _text_column(table.column(text_col)),
        "label": _as_string(table.column(label_col)),
        "source_file": pa.array([source] * n, pa.string()),
        "source_row": pa.array(range(n), pa.int64()),
        "malformed": pa.array([None] * n, pa.string()),
    }, schema=RAW_SCHEMA)


def _read_hf(spec: SourceSpec) -> pa.Table:
    """A Hugging Face dataset split, through ``datasets`` (needs the hub or a local HF cache)."""
    import datasets

    name = spec.uri[len(HF_PREFIX):]
    try:
        ds = datasets.load_dataset(name, revision=spec.revision, split=spec.hf_split)
    except Exception as err:  # noqa: BLE001 - any hub/network failure becomes one clear message
        raise SourceError(f"{spec.uri}: cannot load Hugging Face dataset: {err}") from err
    label_feature = None
    table = ds.data.table
    table, text_col = _text_columns(table, spec.text_column, spec.uri)
    label_col = _pick(table, spec.label_column, LABEL_COLUMNS, "label", spec.uri)
    label_feature = ds.features.get(label_col)
    if isinstance(label_feature, datasets.ClassLabel):  # class ids -> their names
        names = label_feature.names
        labels = pa.array([None if i is None else names[i] for i in table.column(label_col).to_pylist()])
        table = table.set_column(table.column_names.index(label_col), label_col, labels)
    return _to_raw(table, text_col, label_col, spec.uri)
