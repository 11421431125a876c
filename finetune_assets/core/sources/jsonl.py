"""JSON sources: a JSON array read whole; JSON Lines in blocks, line by line where pyarrow
refuses one.
"""

from __future__ import annotations

import codecs
import io
import json
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from finetune_assets.core.sources.base import RAW_SCHEMA, SourceError, SourceSpec
from finetune_assets.core.sources.columns import (
    TEXT_COLUMNS,
    _column_key,
    pick_column,
    pick_label,
    renumber,
    text_columns,
    to_raw,
)
from finetune_assets.core.sources.decoding import Decoder, decode
from finetune_assets.core.sources.delimited import RAW_PREFIX_CHARS


def read_json_array(path: str, data: bytes) -> pa.Table:
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


def jsonl_tables(
    path: str,
    chunks: Iterator[tuple[bytes, bool]],
    spec: SourceSpec,
    require_label: bool,
    limit: int,
) -> Iterator[pa.Table]:
    """JSON Lines in blocks cut after a line end: pyarrow per block, line by line where it
    refuses one.
    """
    decoder = Decoder(path, "utf-8")
    carry, line, record, names = b"", 1, 0, None
    for data, final in chunks:
        buf = carry + data
        cut = len(buf) if final else buf.rfind(b"\n") + 1
        if len(buf) - cut > limit:
            at = line + buf.count(b"\n", 0, cut)
            raise SourceError(
                f"{path}: line {at}: no line end within {limit} bytes (not JSON Lines?)"
            )
        block, carry = buf[:cut], buf[cut:]
        if not block:
            continue
        first, lines = decoder.decoder is None, block.count(b"\n")
        # validates the text and names a bad line; pyarrow reads the bytes
        text = decoder(block, final)
        raw = None
        if text.strip():
            raw, found = _jsonl_block(
                path,
                block.removeprefix(codecs.BOM_UTF8) if first else block,
                text,
                spec,
                require_label,
                names,
            )
            names = names or found
        buf = block = text = data = None  # not held while the consumer has the block
        if raw is not None:
            yield renumber(raw, record, line)
            record += raw.num_rows
        line += lines


def _jsonl_block(
    path: str,
    data: bytes,
    text: str,
    spec: SourceSpec,
    require_label: bool,
    names: list[str] | None,
) -> tuple[pa.Table, list[str]]:
    """One block of JSON Lines (records and lines numbered from the block start) and its column
    names.

    ``names``: the first block's columns, added as nulls where a later block lacks them, so that the
    text and label columns are chosen as on the first block (a whole-file read sees every column).
    """
    try:
        # block as large as the data: one long review never fails with "straddling object" block
        # errors
        table = pajson.read_json(
            io.BytesIO(data),
            read_options=pajson.ReadOptions(block_size=max(1 << 20, len(data) + 1)),
        )
    except pa.ArrowInvalid:
        return _read_jsonl_lines(path, text, spec, require_label, names)
    found = table.column_names[:]
    for name in names or ():
        if name not in found:
            table = table.append_column(name, pa.nulls(table.num_rows))
    if spec.text_column is None:
        table = per_record_text(table)
    table, text_col = text_columns(table, spec.text_column, path)
    raw = to_raw(table, text_col, pick_label(table, spec, path, require_label), path)
    lines = [i + 1 for i, ln in enumerate(data.split(b"\n")) if ln.strip()]
    if len(lines) == raw.num_rows:  # one object per line: keep the line numbers
        for name in ("source_line", "source_line_end"):
            raw = raw.set_column(
                raw.schema.get_field_index(name), name, pa.array(lines, pa.int64())
            )
        raw = flag_missing_text(raw, text.split("\n"), text_col)
    return raw, found


def per_record_text(table: pa.Table) -> pa.Table:
    """Records whose text key changes (``text`` in some, ``review`` in others): where no record
    holds two of the text keys, each record's own one is its text (under the first key's name);
    where some do, the first key wins as for a table, and records without it are quarantined
    naming their keys (:func:`flag_missing_text`).
    """
    by_key = {_column_key(n): n for n in reversed(table.column_names)}
    keys = [by_key[c] for c in TEXT_COLUMNS if c in by_key]
    # a key absent from this block (added as nulls from the first block's names) is one of them
    keys = [
        k
        for k in keys
        if pa.types.is_string(table.column(k).type) or pa.types.is_null(table.column(k).type)
    ]
    if len(keys) < 2 or all(pa.types.is_null(table.column(k).type) for k in keys[1:]):
        return table
    columns = [table.column(k).cast(pa.string()) for k in keys]
    present = [pc.is_valid(c).cast(pa.int8()) for c in columns]
    if pc.max(_sum(present)).as_py() > 1:
        return table
    merged = pc.coalesce(*columns)
    table = table.drop_columns(keys[1:])
    return table.set_column(table.column_names.index(keys[0]), keys[0], merged)


def _sum(arrays):
    total = arrays[0]
    for a in arrays[1:]:
        total = pc.add(total, a)
    return total


def _read_jsonl_lines(
    path: str, text: str, spec: SourceSpec, require_label: bool, names: list[str] | None = None
) -> tuple[pa.Table, list[str]]:
    """JSON Lines that pyarrow refuses (a cut line, mixed types, plain strings): line by line, each
    bad line quarantined with its number and raw text, like a broken CSV record.
    """
    good, bad = _json_lines(text)
    found = list(dict.fromkeys(k for _, _, o in good if isinstance(o, dict) for k in o)) or ["text"]
    header = pa.table({name: pa.nulls(0) for name in dict.fromkeys(found + (names or []))})
    text_col = pick_column(header, spec.text_column, TEXT_COLUMNS, "text", path)
    label_col = pick_label(header, spec, path, require_label)
    texts, problems, labels = [], [], []
    for _, _, obj in good:
        if isinstance(obj, str):
            obj = {text_col: obj}
        value = obj.get(text_col)
        ok = value is None or isinstance(value, str)
        texts.append(value if ok else None)
        problems.append(
            None if ok else f"the text field holds a JSON {type(value).__name__}, not text"
        )
        labels.append(_label_text(obj.get(label_col) if label_col else None))
    n_bad = len(bad)
    table = pa.table(
        {
            "text": pa.array(texts + [None] * n_bad, pa.string()),
            "label": pa.array(labels + [None] * n_bad, pa.string()),
            "source_file": pa.array([path] * (len(good) + n_bad), pa.string()),
            "source_row": pa.array([r for r, _, _ in good] + [b[0] for b in bad], pa.int64()),
            "malformed": pa.array(problems + [b[2] for b in bad], pa.string()),
            "malformed_reason": pa.array(
                [None if p is None else "non_text" for p in problems] + ["malformed_row"] * n_bad,
                pa.string(),
            ),
            "source_line": pa.array([ln for _, ln, _ in good] + [b[1] for b in bad], pa.int64()),
            "source_line_end": pa.array(
                [ln for _, ln, _ in good] + [b[1] for b in bad], pa.int64()
            ),
            "raw": pa.array([None] * len(good) + [b[3] for b in bad], pa.string()),
        },
        schema=RAW_SCHEMA,
    )
    return flag_missing_text(table, text.split("\n"), text_col).sort_by("source_row"), found


def _json_lines(
    text: str,
) -> tuple[list[tuple[int, int, dict | str]], list[tuple[int, int, str, str]]]:
    """Each non-blank line parsed by itself: (record number, line, object or plain string) for a
    usable one, (record number, line, problem, raw prefix) for one that is not.
    """
    good: list[tuple[int, int, dict | str]] = []
    bad: list[tuple[int, int, str, str]] = []
    record = 0
    for n, line in enumerate(text.split("\n"), 1):
        line = line[:-1] if line.endswith("\r") else line
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as err:
            bad.append(
                (record, n, f"not valid JSON ({getattr(err, 'msg', err)})", line[:RAW_PREFIX_CHARS])
            )
        else:
            # a plain string is the text of a review without a label
            if isinstance(obj, (dict, str)):
                good.append((record, n, obj))
            else:
                problem = f"a JSON {type(obj).__name__}, not an object"
                bad.append((record, n, problem, line[:RAW_PREFIX_CHARS]))
        record += 1
    return good, bad


def _label_text(label: object) -> str | None:
    """A JSON label as text: a string as it is, a whole float as an integer (``1.0`` -> ``"1"``),
    anything else as its JSON.
    """
    if label is None or isinstance(label, str):
        return label
    if isinstance(label, float) and label.is_integer():
        return str(int(label))
    return json.dumps(label, ensure_ascii=False)


def flag_missing_text(raw: pa.Table, lines: list[str], text_key: str) -> pa.Table:
    """Rows of ``raw`` (numbered by ``source_line``, 1-based into ``lines``) whose object has no
    ``text_key`` get ``malformed`` (the keys found), ``malformed_reason`` and ``raw`` (the line).
    """
    # several text columns joined: each is optional
    if text_key.startswith("\x00") or not raw.num_rows:
        return raw
    cols = {
        n: raw.column(n).to_pylist()
        for n in ("text", "malformed", "malformed_reason", "raw", "source_line")
    }
    changed = False
    for i, (text, bad, line) in enumerate(
        zip(cols["text"], cols["malformed"], cols["source_line"])
    ):
        if text is not None or bad is not None or line is None or not 0 < line <= len(lines):
            continue
        try:
            obj = json.loads(lines[line - 1])
        except ValueError:
            continue
        if isinstance(obj, dict) and text_key not in obj:
            cols["malformed"][i] = f"no {text_key!r} key (keys: {sorted(obj)[:20]})"
            cols["malformed_reason"][i] = "missing_text_field"
            cols["raw"][i] = lines[line - 1].rstrip("\r")[:RAW_PREFIX_CHARS]
            changed = True
    if not changed:
        return raw
    for name in ("malformed", "malformed_reason", "raw"):
        raw = raw.set_column(
            raw.schema.get_field_index(name), name, pa.array(cols[name], pa.string())
        )
    return raw
