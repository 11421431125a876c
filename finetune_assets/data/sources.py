"""Read one dataset version from its source into a raw table, naming the file and the problem on failure.

A source is a file or folder of CSV / TSV / JSONL / Parquet (local path or fsspec URL), a
Hugging Face dataset id (``hf:owner/name``), or a built-in set (``builtin:rotten_tomatoes``, ``builtin:sample``:
:mod:`finetune_assets.data.builtin`).
Every record read is kept: records the parser cannot use are returned too, flagged ``malformed``
(with their lines and raw text), so that validation can quarantine them and the counts always add up.
:func:`read_file` is the one reader for any input file (sources, ``predict``, evaluation sets).
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import json
import lzma
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from finetune_assets.data.delimited import RAW_PREFIX_CHARS, HeaderError, split_records
from finetune_assets.data.builtin import BuiltinSourceError, check_builtin, is_builtin, read_builtin

HF_PREFIX = "hf:"
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}  # single-file streams, read in full
ARCHIVES = (".zip", ".tar", ".tgz", ".tar.gz", ".7z", ".rar")  # refused: unpack them into the folder
# Column names looked for, in order; a file's names are compared lower-cased with spaces/dashes as "_".
TEXT_COLUMNS = ("text", "review", "content", "sentence", "review_text", "reviewtext", "review_body", "body",
                "comment", "comments", "review_content", "text_review", "feedback", "verified_reviews")
LABEL_COLUMNS = ("label", "polarity", "sentiment", "rating_class", "labels", "class", "rating", "stars",
                 "star_rating", "score", "overall", "review_score")
# Several text columns (text_column "Title,Review Text"): joined in that order into one review text,
# empty parts skipped, separated by this, so dedup, the split hash, the gate and predict see one string.
TEXT_JOIN = "\n"
# Names in a source folder that are never data (documented in docs/reliability.md "Folder sources"):
# hidden files and folders (".*": .DS_Store, ._* AppleDouble files, .ipynb_checkpoints/, .git/ ...),
# OS metadata, completion markers, and documentation beside the data.
IGNORED_DIRS = ("__MACOSX",)
IGNORED_FILES = ("Thumbs.db", "desktop.ini", "_SUCCESS", "_labels.json")  # _labels.json: a drop's label set
DOC_SUFFIXES = (".md", ".txt", ".rst", ".pdf")
DOC_PREFIXES = ("readme", "license", "notice")

# Columns of the raw table handed to validation.
RAW_SCHEMA = pa.schema([
    ("text", pa.string()),
    ("label", pa.string()),
    ("source_file", pa.string()),
    ("source_row", pa.int64()),  # record number in its file (0-based, bad records included)
    ("malformed", pa.string()),  # why the reader could not use the row (None: a good row)
    ("malformed_reason", pa.string()),  # the quarantine reason for it: malformed_row / non_text
    ("source_line", pa.int64()),  # first physical line (CSV/TSV/JSONL, 1-based; None for Parquet)
    ("source_line_end", pa.int64()),
    ("raw", pa.string()),  # a bad record's raw text, first RAW_PREFIX_CHARS characters
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


@dataclass(frozen=True)
class Listing:
    """The files of a source: what is read, and what was left out and why (shown in metadata)."""

    files: list[str]
    ignored: dict[str, str]  # path -> why it is not read


def list_files(uri: str) -> list[str]:
    """The data files of a source: the file itself, or every data file under a folder (sorted)."""
    return list_source(uri).files


def list_source(uri: str) -> Listing:
    fs, path = fsspec.core.url_to_fs(uri)
    if not fs.exists(path):
        raise SourceError(f"{uri}: no such file or folder (check the source path: `versions add --source` "
                          "or raw_reviews config `source`)")
    if not fs.isdir(path):
        _format_or_raise(uri)
        return Listing([uri], {})
    protocol = uri.split("://", 1)[0] + "://" if "://" in uri else ""
    base = path.rstrip("/")
    files, ignored = [], {}
    for p in sorted(fs.find(path)):
        full = protocol + p if protocol and "://" not in p else p
        why = ignored_because(p[len(base):].lstrip("/"))
        if why:
            ignored[full] = why
            continue
        _format_or_raise(full, in_folder=uri)
        files.append(full)
    if not files:
        raise SourceError(f"{uri}: folder holds no data files ({', '.join(_supported())})"
                          + (f"; ignored: {', '.join(sorted(ignored))}" if ignored else ""))
    return Listing(files, ignored)


def ignored_because(rel: str) -> str | None:
    """Why a file at ``rel`` (relative to a source folder) is not data, or None; the one rule, shared with the sensor."""
    parts = rel.split("/")
    name = parts[-1]
    if any(p.startswith(".") for p in parts[:-1]):
        return "inside a hidden folder"
    if any(p in IGNORED_DIRS for p in parts[:-1]):
        return "OS metadata folder"
    if name.startswith("."):
        return "hidden file"
    if name in IGNORED_FILES:
        return "OS metadata or completion marker"
    lowered = name.lower()
    if lowered.endswith(DOC_SUFFIXES) or lowered.startswith(DOC_PREFIXES):
        return "documentation, not data"
    return None


def _supported() -> list[str]:
    return sorted(FORMATS) + [f"{e}{c}" for e in (".csv", ".tsv", ".jsonl") for c in COMPRESSIONS]


def _split_suffix(path: str) -> tuple[str | None, str | None]:
    """(format, compression) from the file name: ``a.csv.gz`` -> ("csv", "gzip")."""
    lowered = path.lower()
    compression = None
    for ext, codec in COMPRESSIONS.items():
        if lowered.endswith(ext):
            lowered, compression = lowered[: -len(ext)], codec
            break
    for ext, fmt in FORMATS.items():
        if lowered.endswith(ext):
            return fmt, compression
    return None, compression


def file_format(path: str) -> str | None:
    """csv / tsv / jsonl / parquet from the file name (compression suffixes looked through), else None."""
    return _split_suffix(path)[0]


def _format_or_raise(path: str, in_folder: str | None = None) -> str:
    fmt = file_format(path)
    if fmt is not None:
        return fmt
    where = f" in source folder {in_folder}" if in_folder else ""
    if path.lower().endswith(ARCHIVES):
        raise SourceError(f"{path}: archives are not read{where}; unpack it into the folder "
                          "(compressed single files .gz/.bz2/.xz/.zst are read directly)")
    raise SourceError(f"{path}: unsupported file type{where} (expected one of {', '.join(_supported())}); "
                      "convert it, or move it out of the source")


def read_source(spec: SourceSpec) -> pa.Table:
    """All rows of a source as :data:`RAW_SCHEMA` (labels as strings, exactly as found)."""
    tables = list(iter_source(spec))
    return pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()


def iter_source(spec: SourceSpec) -> Iterator[pa.Table]:
    """The rows of a source one file at a time (file order of :func:`list_files`), as :data:`RAW_SCHEMA`.

    Memory is bounded by the largest file, not the source: a version that grows by adding files streams.
    """
    if is_builtin(spec.uri):
        try:
            table = read_builtin(spec.uri)
        except BuiltinSourceError as err:
            raise SourceError(str(err)) from err
        yield _to_raw(table, "text", "label", spec.uri)
        return
    if spec.uri.startswith(HF_PREFIX):
        yield _read_hf(spec)
        return
    for path in list_files(spec.uri):
        yield read_file(path, spec)


def check_source(spec: SourceSpec, sample_bytes: int = 1 << 20) -> dict[str, int]:
    """Fail now, not at materialization: every file opens, its columns are found and a sample parses.

    Returns the sampled good rows per file. Hugging Face ids are not probed (no network at registration);
    a built-in set is only located (its package installed, its name known).
    """
    if is_builtin(spec.uri):
        try:
            check_builtin(spec.uri)
        except BuiltinSourceError as err:
            raise SourceError(str(err)) from err
        return {}
    if spec.uri.startswith(HF_PREFIX):
        return {}
    sampled = {}
    for path in list_files(spec.uri):
        table = read_file(path, spec, max_bytes=sample_bytes)
        good = table.column("malformed").null_count
        if table.num_rows and good == 0:
            first = table.filter(pc.is_valid(table.column("malformed"))).slice(0, 1).to_pylist()[0]
            where = f"line {first['source_line']}: " if first["source_line"] else ""
            raise SourceError(f"{path}: {where}no row of the first {sample_bytes} bytes can be used "
                              f"({first['malformed']}); check the delimiter, quoting and text column")
        sampled[path] = good
    return sampled


def read_bytes(path: str) -> bytes:
    """A file's bytes, decompressed by its suffix (.gz / .bz2 / .xz / .zst)."""
    _, compression = _split_suffix(path)
    try:
        with fsspec.open(path, "rb") as f:
            data = f.read()
        if compression == "gzip":
            return gzip.decompress(data)
        if compression == "bz2":
            return bz2.decompress(data)
        if compression == "xz":
            return lzma.decompress(data)
        if compression == "zstd":
            return pa.CompressedInputStream(pa.BufferReader(data), "zstd").read()
        return data
    except (OSError, EOFError, lzma.LZMAError, pa.ArrowException) as err:
        if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise SourceError(f"{path}: cannot open: {err.strerror or err}") from err
        raise SourceError(f"{path}: cannot decompress as {compression}: {err} (a truncated or mislabelled "
                          "download? check the file, or rename it to its real type)") from err


def read_file(path: str, spec: SourceSpec, max_bytes: int | None = None, require_label: bool = True) -> pa.Table:
    """One file as :data:`RAW_SCHEMA`; ``max_bytes`` reads only a prefix (a sample, for checks).

    The public reader for any input file (sources, ``predict``, evaluation sets); without
    ``require_label`` the label column is optional (null when absent).
    """
    fmt = _format_or_raise(path)
    data = read_bytes(path)
    if max_bytes is not None and fmt != "parquet" and len(data) > max_bytes:
        cut = data.rfind(b"\n", 0, max_bytes)
        data = data[: cut + 1] if cut > 0 else data[:max_bytes]
    if not data.strip():
        raise SourceError(f"{path}: file is empty")
    _refuse_disguised(path, data, fmt)
    try:
        if fmt in ("csv", "tsv"):
            return _read_delimited(path, data, fmt, spec, require_label)
        if fmt == "jsonl":
            table = _read_json(path, data)
        else:
            table = pq.read_table(io.BytesIO(data))
    except pa.ArrowInvalid as err:
        if fmt == "jsonl" and not data.lstrip().startswith(b"["):
            return _read_jsonl_lines(path, data, spec, require_label)
        raise SourceError(f"{path}: cannot read as {fmt}: {err}") from err
    table, text_col = _text_columns(table, spec.text_column, path)
    label_col = _pick_label(table, spec, path, require_label)
    raw = _to_raw(table, text_col, label_col, path)
    if fmt == "jsonl" and not data.lstrip().startswith(b"["):
        lines = [i + 1 for i, ln in enumerate(data.split(b"\n")) if ln.strip()]
        if len(lines) == raw.num_rows:  # one object per line: keep the line numbers
            raw = raw.set_column(raw.schema.get_field_index("source_line"), "source_line", pa.array(lines, pa.int64()))
            raw = raw.set_column(raw.schema.get_field_index("source_line_end"), "source_line_end",
                                 pa.array(lines, pa.int64()))
    return raw


MAGIC = {b"\x1f\x8b": ("gzip-compressed", ".gz"), b"BZh": ("bzip2-compressed", ".bz2"),
         b"\xfd7zXZ\x00": ("xz-compressed", ".xz"), b"\x28\xb5\x2f\xfd": ("zstd-compressed", ".zst"),
         b"PK\x03\x04": ("a zip archive (or an Excel .xlsx workbook)", None), b"PAR1": ("a Parquet file", None)}


def _refuse_disguised(path: str, data: bytes, fmt: str) -> None:
    """A text format whose bytes say otherwise (a .csv that is really gzip, Excel or Parquet): say what it is."""
    if fmt == "parquet":
        return
    for magic, (what, suffix) in MAGIC.items():
        if data.startswith(magic):
            fix = (f"add {suffix} to its name" if suffix else
                   "export it as CSV/TSV, or name it .parquet" if "Parquet" in what else "unpack or export it as CSV")
            raise SourceError(f"{path}: the file is {what}, not {fmt} text; {fix}")


def decode(path: str, data: bytes, encoding: str) -> str:
    """Bytes to text: a byte-order mark wins over ``encoding``; an error names the line and a likely encoding."""
    for bom, enc in ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"),
                     (codecs.BOM_UTF16_BE, "utf-16-be")):
        if data.startswith(bom):
            data, encoding = data[len(bom):], enc
            break
    head = data[:4000]
    if encoding.replace("_", "-").lower() in ("utf-8", "utf8") and head.count(b"\x00") > len(head) // 4:
        line = data.count(b"\n", 0, data.index(b"\x00")) + 1
        raise SourceError(f"{path}: line {line}: not valid utf-8 text (every other byte is NUL: UTF-16 without a "
                          "byte-order mark); set the source encoding, e.g. encoding='utf-16' (CLI --encoding "
                          "utf-16, raw_reviews config `encoding`)")
    try:
        return data.decode(encoding)
    except LookupError as err:  # an encoding name Python does not know
        raise SourceError(f"{path}: unknown encoding {encoding!r}: {err} (set a valid encoding: "
                          "CLI --encoding, raw_reviews config `encoding`, e.g. cp1256, cp1252, utf-16)") from err
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        guess = _guess_encoding(data)
        raise SourceError(
            f"{path}: line {line}: not valid {encoding} (byte {data[err.start:err.start + 1].hex()} at offset "
            f"{err.start}); set the source encoding, e.g. encoding='{guess}' (CLI --encoding {guess}, "
            f"raw_reviews config `encoding`)") from err


def _guess_encoding(data: bytes) -> str:
    """A likely encoding for the error message only (never used to read)."""
    if data[:4000].count(b"\x00") > len(data[:4000]) // 4:
        return "utf-16"
    try:
        from charset_normalizer import from_bytes

        best = from_bytes(data[:200_000]).best()
        if best is not None and best.encoding not in ("utf_8", "ascii"):
            return best.encoding.replace("_", "-")
    except Exception:  # noqa: BLE001 - a hint only
        pass
    return "cp1256"


def _read_json(path: str, data: bytes) -> pa.Table:
    """One JSON array (a ``.json`` export) of objects or strings, or JSON Lines of objects (pyarrow)."""
    body = decode(path, data, "utf-8").lstrip()
    if body[:1] == "[":
        try:
            rows = json.loads(body)
        except json.JSONDecodeError as err:
            raise SourceError(f"{path}: line {err.lineno}: not valid JSON ({err.msg})") from err
        if all(isinstance(r, str) for r in rows):
            return pa.table({"text": pa.array(rows, pa.string())})
        if not all(isinstance(r, dict) for r in rows):
            raise SourceError(f"{path}: expected JSON objects (one per review) or strings, found a mix")
        return pa.Table.from_pylist(rows)
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    # block as large as the file: one long review never fails with "straddling object" block errors
    return pajson.read_json(io.BytesIO(data), read_options=pajson.ReadOptions(block_size=max(1 << 20, len(data) + 1)))


def _read_jsonl_lines(path: str, data: bytes, spec: SourceSpec, require_label: bool) -> pa.Table:
    """JSON Lines that pyarrow refuses (a cut line, mixed types, plain strings): line by line, each bad line
    quarantined with its number and raw text, like a broken CSV record."""
    good: list[tuple[int, int, dict | str]] = []  # (record number, line, object or plain string)
    bad: list[tuple[int, int, str, str]] = []  # (record number, line, problem, raw)
    record = 0
    for n, line in enumerate(decode(path, data, "utf-8").split("\n"), 1):
        line = line[:-1] if line.endswith("\r") else line
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as err:
            bad.append((record, n, f"not valid JSON ({getattr(err, 'msg', err)})", line[:RAW_PREFIX_CHARS]))
        else:
            if isinstance(obj, (dict, str)):  # a plain string is the text of a review without a label
                good.append((record, n, obj))
            else:
                bad.append((record, n, f"a JSON {type(obj).__name__}, not an object", line[:RAW_PREFIX_CHARS]))
        record += 1
    names = list(dict.fromkeys(k for _, _, o in good if isinstance(o, dict) for k in o)) or ["text"]
    header = pa.table({name: pa.nulls(0) for name in names})
    text_col = _pick(header, spec.text_column, TEXT_COLUMNS, "text", path)
    label_col = _pick_label(header, spec, path, require_label)
    texts, problems, labels = [], [], []
    for _, _, obj in good:
        if isinstance(obj, str):
            obj = {text_col: obj}
        value = obj.get(text_col)
        ok = value is None or isinstance(value, str)
        texts.append(value if ok else None)
        problems.append(None if ok else f"the text field holds a JSON {type(value).__name__}, not text")
        label = obj.get(label_col) if label_col else None
        labels.append(None if label is None else label if isinstance(label, str) else
                      str(int(label)) if isinstance(label, float) and label.is_integer() else
                      json.dumps(label, ensure_ascii=False))
    n_bad = len(bad)
    table = pa.table({
        "text": pa.array(texts + [None] * n_bad, pa.string()),
        "label": pa.array(labels + [None] * n_bad, pa.string()),
        "source_file": pa.array([path] * (len(good) + n_bad), pa.string()),
        "source_row": pa.array([r for r, _, _ in good] + [b[0] for b in bad], pa.int64()),
        "malformed": pa.array(problems + [b[2] for b in bad], pa.string()),
        "malformed_reason": pa.array([None if p is None else "non_text" for p in problems]
                                     + ["malformed_row"] * n_bad, pa.string()),
        "source_line": pa.array([ln for _, ln, _ in good] + [b[1] for b in bad], pa.int64()),
        "source_line_end": pa.array([ln for _, ln, _ in good] + [b[1] for b in bad], pa.int64()),
        "raw": pa.array([None] * len(good) + [b[3] for b in bad], pa.string()),
    }, schema=RAW_SCHEMA)
    return table.sort_by("source_row")


def _read_delimited(path: str, data: bytes, fmt: str, spec: SourceSpec, require_label: bool = True) -> pa.Table:
    """CSV/TSV through :mod:`finetune_assets.data.delimited`: bad records quarantined with their lines."""
    text = decode(path, data, spec.encoding)
    try:
        recs = split_records(text, "\t" if fmt == "tsv" else ",")
    except HeaderError as err:
        raise SourceError(f"{path}: {err}") from err
    names = recs.header
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SourceError(f"{path}: line {recs.header_line}: duplicate column names {dup} in the header; "
                          "give every column its own name")
    table = pa.table({n: pa.array(c, pa.string()) for n, c in zip(names, recs.columns)}) if names else pa.table({})
    table, text_col = _text_columns(table, spec.text_column, path)
    label_col = _pick_label(table, spec, path, require_label)
    good = _to_raw(table, text_col, label_col, path).drop_columns(["source_row", "source_line", "source_line_end"])
    good = good.append_column("source_row", pa.array(recs.index, pa.int64()))
    good = good.append_column("source_line", pa.array(recs.line, pa.int64()))
    good = good.append_column("source_line_end", pa.array(recs.end_line, pa.int64()))
    bad = pa.table({
        "text": pa.nulls(len(recs.bad), pa.string()),
        "label": pa.nulls(len(recs.bad), pa.string()),
        "source_file": pa.array([path] * len(recs.bad), pa.string()),
        "malformed": pa.array([b.problem for b in recs.bad], pa.string()),
        "malformed_reason": pa.array(["malformed_row"] * len(recs.bad), pa.string()),
        "raw": pa.array([b.raw for b in recs.bad], pa.string()),
        "source_row": pa.array([b.index for b in recs.bad], pa.int64()),
        "source_line": pa.array([b.line for b in recs.bad], pa.int64()),
        "source_line_end": pa.array([b.end_line for b in recs.bad], pa.int64()),
    })
    both = pa.concat_tables([good.select(RAW_SCHEMA.names).cast(RAW_SCHEMA),
                             bad.select(RAW_SCHEMA.names).cast(RAW_SCHEMA)])
    if recs.bad:  # file order, so the quarantine reads top to bottom
        both = both.sort_by("source_row")
    return both


def _pick_label(table: pa.Table, spec: SourceSpec, path: str, required: bool) -> str | None:
    if required or spec.label_column is not None:
        return _pick(table, spec.label_column, LABEL_COLUMNS, "label", path)
    lowered = {n.lower().strip(): n for n in table.column_names}
    return next((lowered[c] for c in LABEL_COLUMNS if c in lowered), None)


def _text_columns(table: pa.Table, wanted: str | None, path: str) -> tuple[pa.Table, str]:
    """The text column, or several (``"title,body"``) joined into one (TEXT_JOIN) named ``"\x00text"``."""
    if wanted is None or wanted in table.column_names or "," not in wanted:
        return table, _pick(table, wanted, TEXT_COLUMNS, "text", path)
    cols = [_pick(table, w.strip(), TEXT_COLUMNS, "text", path) for w in wanted.split(",") if w.strip()]
    parts = [_text_column(table.column(c)) for c in cols]
    joined = []
    for row, values in enumerate(zip(*(texts.to_pylist() for texts, _ in parts))):
        if any(problems[row] is not None for _, problems in parts):
            joined.append(None)  # a part that is not text: the row has no usable text (empty_text quarantine)
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
            raise SourceError(f"{path}: no {role} column {wanted!r} (columns: {names}); fix {role}_column "
                              f"(CLI --{role}-column, raw_reviews config {role}_column)")
        return wanted
    lowered = {_column_key(n): n for n in reversed(names)}  # the first of equal keys wins
    for c in candidates:
        if c in lowered:
            return lowered[c]
    other = next((d for d in (";", "\t", "|", ",") if len(names) == 1 and d in names[0]), None)
    hint = (f"; the header looks {other!r}-separated: export with commas (.csv) or tabs (.tsv)" if other else "")
    raise SourceError(
        f"{path}: no {role} column found (looked for {', '.join(candidates)}; columns: {names}); "
        f"set {role}_column in the raw_reviews config (CLI: --{role}-column){hint}"
    )


def _plain(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """Dictionary-encoded (pandas ``category``) and extension columns as their plain values."""
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if isinstance(col.type, pa.ExtensionType):
        col = col.cast(col.type.storage_type)
    return col


def _as_string(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """Labels as strings, whatever their Parquet/JSON representation (the value itself, never a marker)."""
    col = _plain(col)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.cast(pa.string())
    if pa.types.is_null(col.type):
        return pa.chunked_array([pa.nulls(len(col), pa.string())])
    if pa.types.is_decimal(col.type):
        col = col.cast(pa.float64())
    if pa.types.is_floating(col.type):  # 1.0 -> "1", keeping NaN as null
        col = col.cast(pa.float64())
        col = pc.if_else(pc.is_nan(col), None, col)
        as_int = pc.equal(col, pc.floor(col))
        return pc.if_else(as_int, col.cast(pa.int64(), safe=False).cast(pa.string()), col.cast(pa.string()))
    if pa.types.is_integer(col.type) or pa.types.is_boolean(col.type):
        return col.cast(pa.string())
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return pa.chunked_array([pa.array([None if v is None else v.decode("utf-8", "backslashreplace")
                                           for v in col.to_pylist()], pa.string())])
    # lists, structs, timestamps ...: their value as text, so unknown_label shows what was found
    return pa.chunked_array([pa.array([None if v is None else json.dumps(v, ensure_ascii=False, default=str)
                                       for v in col.to_pylist()], pa.string())])


def _text_column(col: pa.ChunkedArray) -> tuple[pa.ChunkedArray, list[str | None]]:
    """Reviews must be text: (the texts, a non-text problem per row or None)."""
    col = _plain(col)
    n = len(col)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.cast(pa.string()), [None] * n
    if pa.types.is_null(col.type):
        return pa.chunked_array([pa.nulls(n, pa.string())]), [None] * n
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        texts, problems = [], []
        for v in col.to_pylist():
            try:
                texts.append(None if v is None else v.decode("utf-8"))
                problems.append(None)
            except UnicodeDecodeError:
                texts.append(None)
                problems.append("binary value that is not UTF-8 text")
        return pa.chunked_array([pa.array(texts, pa.string())]), problems
    problem = f"the text column holds {col.type}, not text"
    values = col.to_pylist()
    return (pa.chunked_array([pa.nulls(n, pa.string())]),
            [None if v is None else problem for v in values])


def _to_raw(table: pa.Table, text_col: str, label_col: str | None, source: str) -> pa.Table:
    n = table.num_rows
    texts, problems = _text_column(table.column(text_col))
    return pa.table({
        "text": texts,
        "label": _as_string(table.column(label_col)) if label_col else pa.nulls(n, pa.string()),
        "source_file": pa.array([source] * n, pa.string()),
        "source_row": pa.array(range(n), pa.int64()),
        "malformed": pa.array(problems, pa.string()),
        "malformed_reason": pa.array([None if p is None else "non_text" for p in problems], pa.string()),
        "source_line": pa.nulls(n, pa.int64()),
        "source_line_end": pa.nulls(n, pa.int64()),
        "raw": pa.nulls(n, pa.string()),
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
