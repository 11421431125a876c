"""Readers of one input file (CSV / TSV / JSON / JSON Lines / Parquet), streamed in bounded
blocks.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import itertools
from collections.abc import Iterator
from dataclasses import replace

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from finetune_assets.core.sources.base import (
    BLOCK_BYTES,
    HEAD_BYTES,
    MAX_RECORD_BLOCKS,
    PARQUET_ROW_BYTES,
    RAW_SCHEMA,
    SourceError,
    SourceSpec,
)
from finetune_assets.core.sources.columns import pick_label, renumber, text_columns, to_raw
from finetune_assets.core.sources.decoding import (
    Decoder,
    file_blocks,
    open_failed,
    read_bytes,
    refuse_disguised,
)
from finetune_assets.core.sources.delimited import (
    HeaderError,
    Records,
    RecordTooLong,
    split_records,
)
from finetune_assets.core.sources.jsonl import jsonl_tables, read_json_array
from finetune_assets.core.sources.listing import format_or_raise, list_files, split_suffix


def read_file(
    path: str, spec: SourceSpec, max_bytes: int | None = None, require_label: bool = True
) -> pa.Table:
    """One file as :data:`RAW_SCHEMA`; ``max_bytes`` reads only a prefix (a sample, for checks).

    The public reader for any input file (sources, ``predict``, evaluation sets); without
    ``require_label`` the label column is optional (null when absent). Streamed (:func:`iter_file`)
    and concatenated.
    """
    tables = list(iter_file(path, spec, max_bytes=max_bytes, require_label=require_label))
    return pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()


def iter_file(
    path: str,
    spec: SourceSpec,
    block_bytes: int = BLOCK_BYTES,
    max_bytes: int | None = None,
    require_label: bool = True,
) -> Iterator[pa.Table]:
    """One file as :data:`RAW_SCHEMA` tables of about ``block_bytes`` input bytes each, in file
    order.

    Concatenated, the tables equal a whole-file read row for row (``source_row`` and lines continue
    across blocks): CSV/TSV blocks end on record boundaries (:func:`split_records` carries an
    unfinished record over), text is decoded incrementally (a character split across blocks decodes
    whole), compressed files are decompressed as a stream, JSON Lines blocks end on line ends,
    Parquet is read in batches of about ``block_bytes / PARQUET_ROW_BYTES`` rows. A JSON array file
    (``[...]``) is read whole: it has no lines to cut on. Where a block could differ from the whole
    file, the first block decides: the columns of a JSON Lines file (later blocks get the first
    block's columns, null where absent) and classic-Mac (CR-only) line ends.
    """
    fmt = format_or_raise(path)
    if fmt == "parquet":
        yield from _parquet_tables(path, spec, block_bytes, require_label)
        return
    chunks = file_blocks(path, block_bytes, max_bytes, spec.encoding)
    first, final = next(chunks)
    if final and not first.strip():
        raise SourceError(f"{path}: file is empty")
    refuse_disguised(path, first, fmt)
    chunks = itertools.chain([(first, final)], chunks)
    limit = MAX_RECORD_BLOCKS * max(block_bytes, HEAD_BYTES)
    if fmt in ("csv", "tsv"):
        yield from _delimited_tables(path, chunks, fmt, spec, require_label, limit)
    elif first.removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"["):
        data = b"".join(c for c, _ in chunks)  # a JSON array: one document, read whole
        try:
            table = read_json_array(path, data)
        except pa.ArrowInvalid as err:
            raise SourceError(f"{path}: cannot read as {fmt}: {err}") from err
        table, text_col = text_columns(table, spec.text_column, path)
        yield to_raw(table, text_col, pick_label(table, spec, path, require_label), path)
    else:
        yield from jsonl_tables(path, chunks, spec, require_label, limit)


def _parquet_tables(
    path: str, spec: SourceSpec, block_bytes: int, require_label: bool
) -> Iterator[pa.Table]:
    """Parquet in record batches (``source_row`` continuing); a compressed Parquet file is read
    whole.
    """
    _, compression = split_suffix(path)
    try:
        with contextlib.ExitStack() as stack:
            f = (
                io.BytesIO(read_bytes(path))
                if compression
                else stack.enter_context(fsspec.open(path, "rb"))
            )
            head = f.read(64)
            if len(head) < 64 and not head.strip():
                raise SourceError(f"{path}: file is empty")
            f.seek(0)
            pf = pq.ParquetFile(f)
            rows_per_batch = max(1, block_bytes // PARQUET_ROW_BYTES)
            tables = (
                pa.Table.from_batches([b]) for b in pf.iter_batches(batch_size=rows_per_batch)
            )
            row = 0
            # columns checked
            for table in tables if pf.metadata.num_rows else [pf.schema_arrow.empty_table()]:
                table, text_col = text_columns(table, spec.text_column, path)
                raw = to_raw(table, text_col, pick_label(table, spec, path, require_label), path)
                yield renumber(raw, row)
                row += raw.num_rows
    except pa.ArrowInvalid as err:
        raise SourceError(f"{path}: cannot read as parquet: {err}") from err
    except (FileNotFoundError, PermissionError, IsADirectoryError) as err:
        raise open_failed(path, compression, err) from err


DELIMITERS = (",", ";", "\t", "|")  # a tie goes to the first


def sniff_delimiter(text: str) -> str:
    """The delimiter of a CSV export by its header line: the candidate seen most often outside
    quotes (European spreadsheets export ``;``, some tools ``|`` or tabs); ``,`` when none is.
    """
    header, quoted, counts = text.split("\n", 1)[0], False, dict.fromkeys(DELIMITERS, 0)
    for c in header:
        if c == '"':
            quoted = not quoted
        elif not quoted and c in counts:
            counts[c] += 1
    best = max(DELIMITERS, key=lambda d: counts[d])
    return best if counts[best] else ","


def delimiter_of(text: str, fmt: str, spec: SourceSpec) -> str:
    """``spec.delimiter`` where set; tab for TSV; the header's for CSV."""
    if spec.delimiter:
        return spec.delimiter
    return "\t" if fmt == "tsv" else sniff_delimiter(text)


def pin_files(spec: SourceSpec) -> SourceSpec:
    """A CSV export's sniffed delimiter recorded in the version where it is not the comma, so a
    later read never sniffs again.
    """
    if spec.delimiter is not None:
        return spec
    for path in list_files(spec.uri):
        if format_or_raise(path) != "csv":
            continue
        try:
            data, _ = next(file_blocks(path, HEAD_BYTES * 16, HEAD_BYTES * 16, spec.encoding))
            found = sniff_delimiter(Decoder(path, spec.encoding)(data, True))
        except SourceError:  # the read itself says what is wrong
            return spec
        return spec if found == "," else replace(spec, delimiter=found)
    return spec


def _delimited_tables(
    path: str,
    chunks: Iterator[tuple[bytes, bool]],
    fmt: str,
    spec: SourceSpec,
    require_label: bool,
    limit: int,
) -> Iterator[pa.Table]:
    """CSV/TSV through :mod:`finetune_assets.core.sources.delimited`, block by block: bad records
    quarantined with their lines; a record the block may cut is carried into the next (``limit``:
    how far, see :func:`split_records`).

    Classic-Mac line ends (CR only) are decided on the first text holding a line end: no LF in it, a
    CR before its end.
    """
    decoder = Decoder(path, spec.encoding)
    carry, recs, mac, yielded, delimiter = "", None, None, False, None
    for data, final in chunks:
        text = carry + decoder(data, final)
        if delimiter is None:
            delimiter = delimiter_of(text, fmt, spec)
        if mac is None and "\n" in text:
            mac = False
        elif mac is None and "\r" in text[:-1]:
            mac = True
        if mac:
            text = text.replace("\r", "\n")
        try:
            # undecided line ends: nothing parsed yet, so the text is the file so far (split_records
            # decides)
            recs = split_records(
                text,
                delimiter,
                final=final,
                after=recs if mac is not None else None,
                max_record=limit,
                quoting=spec.quoting != "none",
                escapechar=spec.escapechar,
            )
        except (HeaderError, RecordTooLong) as err:
            raise SourceError(f"{path}: {err}") from err
        carry, text, data = text[recs.consumed :], None, None
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
        raise SourceError(
            f"{path}: line {recs.header_line}: duplicate column names {dup} in the header; "
            "give every column its own name"
        )
    table = (
        pa.table({n: pa.array(c, pa.string()) for n, c in zip(names, recs.columns)})
        if names
        else pa.table({})
    )
    table, text_col = text_columns(table, spec.text_column, path)
    label_col = pick_label(table, spec, path, require_label)
    good = to_raw(table, text_col, label_col, path).drop_columns(
        ["source_row", "source_line", "source_line_end"]
    )
    good = good.append_column("source_row", pa.array(recs.index, pa.int64()))
    good = good.append_column("source_line", pa.array(recs.line, pa.int64()))
    good = good.append_column("source_line_end", pa.array(recs.end_line, pa.int64()))
    bad = pa.table(
        {
            "text": pa.nulls(len(recs.bad), pa.string()),
            "label": pa.nulls(len(recs.bad), pa.string()),
            "source_file": pa.array([path] * len(recs.bad), pa.string()),
            "malformed": pa.array([b.problem for b in recs.bad], pa.string()),
            # malformed_row, header_row ...
            "malformed_reason": pa.array([b.reason for b in recs.bad], pa.string()),
            "raw": pa.array([b.raw for b in recs.bad], pa.string()),
            "source_row": pa.array([b.index for b in recs.bad], pa.int64()),
            "source_line": pa.array([b.line for b in recs.bad], pa.int64()),
            "source_line_end": pa.array([b.end_line for b in recs.bad], pa.int64()),
        }
    )
    both = pa.concat_tables(
        [
            good.select(RAW_SCHEMA.names).cast(RAW_SCHEMA),
            bad.select(RAW_SCHEMA.names).cast(RAW_SCHEMA),
        ]
    )
    if recs.bad:  # file order, so the quarantine reads top to bottom
        both = both.sort_by("source_row")
    return both


def iter_files(spec: SourceSpec, block_bytes: int = BLOCK_BYTES) -> Iterator[pa.Table]:
    """A file or folder source: every data file of :func:`list_files`, in order, each streamed."""
    for path in list_files(spec.uri):
        yield from iter_file(path, spec, block_bytes=block_bytes)


def check_files(spec: SourceSpec, sample_bytes: int) -> dict[str, int]:
    """Every file opens, its columns are found and a sample parses: the sampled good rows per
    file.
    """
    sampled = {}
    for path in list_files(spec.uri):
        table = read_file(path, spec, max_bytes=sample_bytes)
        good = table.column("malformed").null_count
        if table.num_rows and good == 0:
            first = table.filter(pc.is_valid(table.column("malformed"))).slice(0, 1).to_pylist()[0]
            where = f"line {first['source_line']}: " if first["source_line"] else ""
            raise SourceError(
                f"{path}: {where}no row of the first {sample_bytes} bytes can be used "
                f"({first['malformed']}); check the delimiter, quoting and text column"
            )
        sampled[path] = good
    return sampled
