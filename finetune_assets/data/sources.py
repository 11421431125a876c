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
import contextlib
import gzip
import io
import itertools
import json
import lzma
from collections.abc import Iterator
from dataclasses import dataclass, replace

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from finetune_assets.data.delimited import RAW_PREFIX_CHARS, HeaderError, Records, RecordTooLong, split_records
from finetune_assets.data.builtin import BuiltinSourceError, check_builtin, is_builtin, read_builtin

HF_PREFIX = "hf:"
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}  # single-file streams, decompressed as read
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

# Streaming (issue 15, bounded memory): a file is read in blocks of this many (decompressed) input bytes, so
# one huge file costs a block, not the file. The first block is at least HEAD_BYTES (the encoding checks);
# a record still open after MAX_RECORD_BLOCKS blocks is not carried further (split_records' max_record);
# Parquet batches hold block / PARQUET_ROW_BYTES rows (about a review's size).
BLOCK_BYTES = 16 << 20  # parsed rows cost ~10x their bytes in Python objects: ~160 MB peak
HEAD_BYTES = 4096
MAX_RECORD_BLOCKS = 4  # 64 MiB: far above any review, and a stray quote costs at most 4 rescans
PARQUET_ROW_BYTES = 1024

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


def iter_source(spec: SourceSpec, block_bytes: int = BLOCK_BYTES) -> Iterator[pa.Table]:
    """The rows of a source in bounded blocks (file order of :func:`list_files`), as :data:`RAW_SCHEMA`.

    Each file is streamed (:func:`iter_file`), so memory is bounded by ``block_bytes``, not by the largest
    file: a version that is one 5 GB CSV reads like one of many small files.
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
        yield from iter_file(path, spec, block_bytes=block_bytes)


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
    return b"".join(chunk for chunk, _ in _chunks(path, BLOCK_BYTES))


def _open_failed(path: str, compression: str | None, err: Exception) -> SourceError:
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return SourceError(f"{path}: cannot open: {err.strerror or err}")
    return SourceError(f"{path}: cannot decompress as {compression}: {err} (a truncated or mislabelled "
                       "download? check the file, or rename it to its real type)")


def _decompressed(f, compression: str | None):
    """A file object reading ``f`` decompressed as a stream (never the whole file at once)."""
    if compression == "gzip":
        return gzip.GzipFile(fileobj=f, mode="rb")
    if compression == "bz2":
        return bz2.BZ2File(f)
    if compression == "xz":
        return lzma.LZMAFile(f)
    if compression == "zstd":
        return pa.CompressedInputStream(pa.PythonFile(f, mode="r"), "zstd")
    return contextlib.nullcontext(f)


def _chunks(path: str, block_bytes: int, max_bytes: int | None = None) -> Iterator[tuple[bytes, bool]]:
    """A file's decompressed bytes as (block, last) pairs of ``block_bytes``.

    The first block holds at least :data:`HEAD_BYTES` and is not all whitespace unless the file is (the
    empty-file, disguised-file and UTF-16 checks look at it). ``max_bytes``: one block, the prefix cut
    after its last full line (a sample).
    """
    _, compression = _split_suffix(path)
    try:
        with fsspec.open(path, "rb") as raw, _decompressed(raw, compression) as f:
            if max_bytes is not None:
                data = f.read(max_bytes + 1)
                if len(data) > max_bytes:
                    cut = data.rfind(b"\n", 0, max_bytes)
                    data = data[: cut + 1] if cut > 0 else data[:max_bytes]
                yield data, True
                return
            block = f.read(max(block_bytes, HEAD_BYTES))
            while block and not block.strip() and len(block) < MAX_RECORD_BLOCKS * block_bytes:
                more = f.read(block_bytes)
                if not more:
                    break
                block += more
            while True:
                following = f.read(block_bytes)
                yield block, not following
                if not following:
                    return
                block = following
    except (OSError, EOFError, lzma.LZMAError, pa.ArrowException) as err:
        raise _open_failed(path, compression, err) from err


def read_file(path: str, spec: SourceSpec, max_bytes: int | None = None, require_label: bool = True) -> pa.Table:
    """One file as :data:`RAW_SCHEMA`; ``max_bytes`` reads only a prefix (a sample, for checks).

    The public reader for any input file (sources, ``predict``, evaluation sets); without
    ``require_label`` the label column is optional (null when absent). Streamed (:func:`iter_file`) and
    concatenated.
    """
    tables = list(iter_file(path, spec, max_bytes=max_bytes, require_label=require_label))
    return pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()


def iter_file(path: str, spec: SourceSpec, block_bytes: int = BLOCK_BYTES, max_bytes: int | None = None,
              require_label: bool = True) -> Iterator[pa.Table]:
    """One file as :data:`RAW_SCHEMA` tables of about ``block_bytes`` input bytes each, in file order.

    Concatenated, the tables equal a whole-file read row for row (``source_row`` and lines continue across
    blocks): CSV/TSV blocks end on record boundaries (:func:`split_records` carries an unfinished record
    over), text is decoded incrementally (a character split across blocks decodes whole), compressed files
    are decompressed as a stream, JSON Lines blocks end on line ends, Parquet is read in batches of about
    ``block_bytes / PARQUET_ROW_BYTES`` rows. A JSON array file (``[...]``) is read whole: it has no lines
    to cut on. Where a block could differ from the whole file, the first block decides: the columns of a
    JSON Lines file (later blocks get the first block's columns, null where absent) and classic-Mac
    (CR-only) line ends.
    """
    fmt = _format_or_raise(path)
    if fmt == "parquet":
        yield from _parquet_tables(path, spec, block_bytes, require_label)
        return
    chunks = _chunks(path, block_bytes, max_bytes)
    first, final = next(chunks)
    if final and not first.strip():
        raise SourceError(f"{path}: file is empty")
    _refuse_disguised(path, first, fmt)
    chunks = itertools.chain([(first, final)], chunks)
    limit = MAX_RECORD_BLOCKS * max(block_bytes, HEAD_BYTES)
    if fmt in ("csv", "tsv"):
        yield from _delimited_tables(path, chunks, fmt, spec, require_label, limit)
    elif first.removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"["):
        data = b"".join(c for c, _ in chunks)  # a JSON array: one document, read whole
        try:
            table = _read_json(path, data)
        except pa.ArrowInvalid as err:
            raise SourceError(f"{path}: cannot read as {fmt}: {err}") from err
        table, text_col = _text_columns(table, spec.text_column, path)
        yield _to_raw(table, text_col, _pick_label(table, spec, path, require_label), path)
    else:
        yield from _jsonl_tables(path, chunks, spec, require_label, limit)


def _parquet_tables(path: str, spec: SourceSpec, block_bytes: int, require_label: bool) -> Iterator[pa.Table]:
    """Parquet in record batches (``source_row`` continuing); a compressed Parquet file is read whole."""
    _, compression = _split_suffix(path)
    try:
        with contextlib.ExitStack() as stack:
            f = (io.BytesIO(read_bytes(path)) if compression else stack.enter_context(fsspec.open(path, "rb")))
            head = f.read(64)
            if len(head) < 64 and not head.strip():
                raise SourceError(f"{path}: file is empty")
            f.seek(0)
            pf = pq.ParquetFile(f)
            rows_per_batch = max(1, block_bytes // PARQUET_ROW_BYTES)
            tables = (pa.Table.from_batches([b]) for b in pf.iter_batches(batch_size=rows_per_batch))
            row = 0
            for table in tables if pf.metadata.num_rows else [pf.schema_arrow.empty_table()]:  # columns checked
                table, text_col = _text_columns(table, spec.text_column, path)
                raw = _to_raw(table, text_col, _pick_label(table, spec, path, require_label), path)
                yield _renumber(raw, row)
                row += raw.num_rows
    except pa.ArrowInvalid as err:
        raise SourceError(f"{path}: cannot read as parquet: {err}") from err
    except (FileNotFoundError, PermissionError, IsADirectoryError) as err:
        raise _open_failed(path, compression, err) from err


def _renumber(raw: pa.Table, first_row: int, first_line: int | None = None) -> pa.Table:
    """A block's rows numbered on from ``first_row`` (and lines from ``first_line``) in the whole file."""
    cols = {"source_row": first_row} | ({"source_line": first_line - 1, "source_line_end": first_line - 1}
                                        if first_line is not None else {})
    for name, add in cols.items():
        if add:
            i = raw.schema.get_field_index(name)
            raw = raw.set_column(i, name, pc.add(raw.column(i), add))
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
    return _Decoder(path, encoding)(data, final=True)


class _Decoder:
    """A file's bytes to text block by block, as :func:`decode` on the whole file would give.

    The byte-order mark and the UTF-16-without-BOM check are decided on the first block (at least
    :data:`HEAD_BYTES`); an incremental decoder keeps a character split across blocks whole; a decode
    error names its line and offset in the whole file.
    """

    def __init__(self, path: str, encoding: str):
        self.path, self.encoding = path, encoding
        self.decoder = None
        self.head = b""  # the first bytes, for the encoding guess in an error message
        self.fed = self.newlines = 0  # bytes (after the BOM) and line ends decoded so far

    def __call__(self, data: bytes, final: bool) -> str:
        if self.decoder is None:
            self._start(data)
            data = data[self.bom:]
        if len(self.head) < 200_000:
            self.head += data[:200_000 - len(self.head)]
        pending = self.decoder.getstate()[0]
        pending = pending if isinstance(pending, bytes) else b""
        try:
            text = self.decoder.decode(data, final)
        except UnicodeDecodeError as err:
            blob = pending + data
            line = self.newlines - pending.count(b"\n") + blob.count(b"\n", 0, err.start) + 1
            guess = _guess_encoding(self.head)
            raise SourceError(
                f"{self.path}: line {line}: not valid {self.encoding} (byte {blob[err.start:err.start + 1].hex()} "
                f"at offset {self.fed - len(pending) + err.start}); set the source encoding, e.g. encoding='{guess}' "
                f"(CLI --encoding {guess}, raw_reviews config `encoding`)") from err
        self.fed += len(data)
        self.newlines += data.count(b"\n")
        return text

    def _start(self, first: bytes) -> None:
        """The encoding (a byte-order mark wins), refusing UTF-16 read as UTF-8 (every other byte NUL)."""
        self.bom = 0
        for bom, enc in ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"),
                         (codecs.BOM_UTF16_BE, "utf-16-be")):
            if first.startswith(bom):
                self.bom, self.encoding = len(bom), enc
                break
        head = first[self.bom:self.bom + 4000]
        if self.encoding.replace("_", "-").lower() in ("utf-8", "utf8") and head.count(b"\x00") > len(head) // 4:
            line = head.count(b"\n", 0, head.index(b"\x00")) + 1
            raise SourceError(f"{self.path}: line {line}: not valid utf-8 text (every other byte is NUL: UTF-16 "
                              "without a byte-order mark); set the source encoding, e.g. encoding='utf-16' (CLI "
                              "--encoding utf-16, raw_reviews config `encoding`)")
        try:
            if not getattr(codecs.lookup(self.encoding), "_is_text_encoding", True):
                raise LookupError(f"{self.encoding!r} is not a text encoding")
            self.decoder = codecs.getincrementaldecoder(self.encoding)()
        except LookupError as err:  # an encoding name Python does not know
            raise SourceError(f"{self.path}: unknown encoding {self.encoding!r}: {err} (set a valid encoding: "
                              "CLI --encoding, raw_reviews config `encoding`, e.g. cp1256, cp1252, utf-16)") from err


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
    """One JSON array (a ``.json`` export) of objects or strings."""
    try:
        rows = json.loads(decode(path, data, "utf-8"))
    except json.JSONDecodeError as err:
        raise SourceError(f"{path}: line {err.lineno}: not valid JSON ({err.msg})") from err
    if all(isinstance(r, str) for r in rows):
        return pa.table({"text": pa.array(rows, pa.string())})
    if not all(isinstance(r, dict) for r in rows):
        raise SourceError(f"{path}: expected JSON objects (one per review) or strings, found a mix")
    return pa.Table.from_pylist(rows)


def _jsonl_tables(path: str, chunks: Iterator[tuple[bytes, bool]], spec: SourceSpec, require_label: bool,
                  limit: int) -> Iterator[pa.Table]:
    """JSON Lines in blocks cut after a line end: pyarrow per block, line by line where it refuses one."""
    decoder = _Decoder(path, "utf-8")
    carry, line, record, names = b"", 1, 0, None
    for data, final in chunks:
        buf = carry + data
        cut = len(buf) if final else buf.rfind(b"\n") + 1
        if len(buf) - cut > limit:
            at = line + buf.count(b"\n", 0, cut)
            raise SourceError(f"{path}: line {at}: no line end within {limit} bytes (not JSON Lines?)")
        block, carry = buf[:cut], buf[cut:]
        if not block:
            continue
        first, lines = decoder.decoder is None, block.count(b"\n")
        text = decoder(block, final)  # validates the text and names a bad line; pyarrow reads the bytes
        raw = None
        if text.strip():
            raw, found = _jsonl_block(path, block.removeprefix(codecs.BOM_UTF8) if first else block, text, spec,
                                      require_label, names)
            names = names or found
        buf = block = text = data = None  # not held while the consumer has the block
        if raw is not None:
            yield _renumber(raw, record, line)
            record += raw.num_rows
        line += lines


def _jsonl_block(path: str, data: bytes, text: str, spec: SourceSpec, require_label: bool,
                 names: list[str] | None) -> tuple[pa.Table, list[str]]:
    """One block of JSON Lines (records and lines numbered from the block start) and its column names.

    ``names``: the first block's columns, added as nulls where a later block lacks them, so that the text
    and label columns are chosen as on the first block (a whole-file read sees every column)."""
    try:
        # block as large as the data: one long review never fails with "straddling object" block errors
        table = pajson.read_json(io.BytesIO(data), read_options=pajson.ReadOptions(
            block_size=max(1 << 20, len(data) + 1)))
    except pa.ArrowInvalid:
        return _read_jsonl_lines(path, text, spec, require_label, names)
    found = table.column_names[:]
    for name in names or ():
        if name not in found:
            table = table.append_column(name, pa.nulls(table.num_rows))
    table, text_col = _text_columns(table, spec.text_column, path)
    raw = _to_raw(table, text_col, _pick_label(table, spec, path, require_label), path)
    lines = [i + 1 for i, ln in enumerate(data.split(b"\n")) if ln.strip()]
    if len(lines) == raw.num_rows:  # one object per line: keep the line numbers
        for name in ("source_line", "source_line_end"):
            raw = raw.set_column(raw.schema.get_field_index(name), name, pa.array(lines, pa.int64()))
    return raw, found


def _read_jsonl_lines(path: str, text: str, spec: SourceSpec, require_label: bool,
                      names: list[str] | None = None) -> tuple[pa.Table, list[str]]:
    """JSON Lines that pyarrow refuses (a cut line, mixed types, plain strings): line by line, each bad line
    quarantined with its number and raw text, like a broken CSV record."""
    good: list[tuple[int, int, dict | str]] = []  # (record number, line, object or plain string)
    bad: list[tuple[int, int, str, str]] = []  # (record number, line, problem, raw)
    record = 0
    for n, line in enumerate(text.split("\n"), 1):
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
    found = list(dict.fromkeys(k for _, _, o in good if isinstance(o, dict) for k in o)) or ["text"]
    header = pa.table({name: pa.nulls(0) for name in dict.fromkeys(found + (names or []))})
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
    return table.sort_by("source_row"), found


def _delimited_tables(path: str, chunks: Iterator[tuple[bytes, bool]], fmt: str, spec: SourceSpec,
                      require_label: bool, limit: int) -> Iterator[pa.Table]:
    """CSV/TSV through :mod:`finetune_assets.data.delimited`, block by block: bad records quarantined with their
    lines; a record the block may cut is carried into the next (``limit``: how far, see :func:`split_records`).

    Classic-Mac line ends (CR only) are decided on the first text holding a line end: no LF in it, a CR
    before its end.
    """
    decoder = _Decoder(path, spec.encoding)
    carry, recs, mac, yielded = "", None, None, False
    for data, final in chunks:
        text = carry + decoder(data, final)
        if mac is None and "\n" in text:
            mac = False
        elif mac is None and "\r" in text[:-1]:
            mac = True
        if mac:
            text = text.replace("\r", "\n")
        try:
            # undecided line ends: nothing parsed yet, so the text is the file so far (split_records decides)
            recs = split_records(text, "\t" if fmt == "tsv" else ",", final=final,
                                 after=recs if mac is not None else None, max_record=limit)
        except (HeaderError, RecordTooLong) as err:
            raise SourceError(f"{path}: {err}") from err
        carry, text, data = text[recs.consumed:], None, None
        table = _records_table(path, recs, spec, require_label) if recs.records or final else None
        # the next block needs only the header and where to go on: drop this block's Python rows now
        recs = replace(recs, columns=[], index=[], line=[], end_line=[], bad=[])
        if table is not None and (table.num_rows or (final and not yielded)):
            yielded = True
            yield table
        table = None


def _records_table(path: str, recs: Records, spec: SourceSpec, require_label: bool) -> pa.Table:
    """Parsed records as :data:`RAW_SCHEMA`, good and bad rows in file order."""
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
