"""Finding the text and label columns of any table, and turning them into :data:`RAW_SCHEMA`
rows.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from finetune_assets.core.sources.base import RAW_SCHEMA, SourceError, SourceSpec

# Column names looked for, in order; a file's names are compared lower-cased with spaces/dashes as
# "_".
TEXT_COLUMNS = (
    "text",
    "review",
    "content",
    "sentence",
    "review_text",
    "reviewtext",
    "review_body",
    "body",
    "comment",
    "comments",
    "review_content",
    "text_review",
    "feedback",
    "verified_reviews",
)
LABEL_COLUMNS = (
    "label",
    "polarity",
    "sentiment",
    "rating_class",
    "labels",
    "class",
    "rating",
    "stars",
    "star_rating",
    "score",
    "overall",
    "review_score",
)
# Several text columns (text_column "Title,Review Text"): joined in that order into one review text,
# empty parts skipped, separated by this, so dedup, the split hash, the gate and predict see one
# string.
TEXT_JOIN = "\n"


def renumber(raw: pa.Table, first_row: int, first_line: int | None = None) -> pa.Table:
    """A block's rows numbered on from ``first_row`` (and lines from ``first_line``) in the whole
    file.
    """
    cols = {"source_row": first_row} | (
        {"source_line": first_line - 1, "source_line_end": first_line - 1}
        if first_line is not None
        else {}
    )
    for name, add in cols.items():
        if add:
            i = raw.schema.get_field_index(name)
            raw = raw.set_column(i, name, pc.add(raw.column(i), add))
    return raw


def pick_label(table: pa.Table, spec: SourceSpec, path: str, required: bool) -> str | None:
    if required or spec.label_column is not None:
        return pick_column(table, spec.label_column, LABEL_COLUMNS, "label", path)
    lowered = {n.lower().strip(): n for n in table.column_names}
    return next((lowered[c] for c in LABEL_COLUMNS if c in lowered), None)


def text_columns(table: pa.Table, wanted: str | None, path: str) -> tuple[pa.Table, str]:
    """The text column, or several (``"title,body"``) joined into one (TEXT_JOIN) named
    ``"\x00text"``.
    """
    if wanted is None or wanted in table.column_names or "," not in wanted:
        return table, pick_column(table, wanted, TEXT_COLUMNS, "text", path)
    cols = [
        pick_column(table, w.strip(), TEXT_COLUMNS, "text", path)
        for w in wanted.split(",")
        if w.strip()
    ]
    parts = [_text_column(table.column(c)) for c in cols]
    joined = []
    for row, values in enumerate(zip(*(texts.to_pylist() for texts, _ in parts))):
        if any(problems[row] is not None for _, problems in parts):
            # a part that is not text: the row has no usable text (empty_text quarantine)
            joined.append(None)
            continue
        present = [v.strip() for v in values if v is not None and v.strip()]
        joined.append(TEXT_JOIN.join(present) if present else None)
    return table.append_column("\x00text", pa.array(joined, pa.string())), "\x00text"


def _column_key(name: str) -> str:
    return "_".join(name.lower().replace("-", " ").split())


def pick_column(
    table: pa.Table, wanted: str | None, candidates: tuple[str, ...], role: str, path: str
) -> str:
    names = table.column_names
    if wanted is not None:
        if wanted not in names:
            raise SourceError(
                f"{path}: no {role} column {wanted!r} (columns: {names}); fix {role}_column "
                f"(CLI --{role}-column, raw_reviews config {role}_column)"
            )
        return wanted
    lowered = {_column_key(n): n for n in reversed(names)}  # the first of equal keys wins
    for c in candidates:
        if c in lowered:
            return lowered[c]
    other = next((d for d in (";", "\t", "|", ",") if len(names) == 1 and d in names[0]), None)
    hint = (
        f"; the header looks {other!r}-separated: set the delimiter (CLI --delimiter {other!r})"
        if other
        else ""
    )
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
    """Labels as strings, whatever their Parquet/JSON representation (the value itself, never a
    marker).
    """
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
        return pc.if_else(
            as_int, col.cast(pa.int64(), safe=False).cast(pa.string()), col.cast(pa.string())
        )
    if pa.types.is_integer(col.type) or pa.types.is_boolean(col.type):
        return col.cast(pa.string())
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return pa.chunked_array(
            [
                pa.array(
                    [
                        None if v is None else v.decode("utf-8", "backslashreplace")
                        for v in col.to_pylist()
                    ],
                    pa.string(),
                )
            ]
        )
    # lists, structs, timestamps ...: their value as text, so unknown_label shows what was found
    return pa.chunked_array(
        [
            pa.array(
                [
                    None if v is None else json.dumps(v, ensure_ascii=False, default=str)
                    for v in col.to_pylist()
                ],
                pa.string(),
            )
        ]
    )


NUL_PROBLEM = "a NUL byte in the text (a stray control byte of the export)"


def _text_column(col: pa.ChunkedArray) -> tuple[pa.ChunkedArray, list[str | None]]:
    """Reviews must be text: (the texts, a non-text problem per row or None)."""
    col = _plain(col)
    n = len(col)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = col.cast(pa.string())
        nul = pc.match_substring(col, "\x00")
        if not pc.any(nul).as_py():
            return col, [None] * n
        # a stray NUL (some database exports write them): the row is quarantined, not the file
        problems = [NUL_PROBLEM if bad else None for bad in nul.to_pylist()]
        return pc.if_else(nul, pa.scalar(None, pa.string()), col), problems
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
    return (
        pa.chunked_array([pa.nulls(n, pa.string())]),
        [None if v is None else problem for v in values],
    )


def source_columns(schema: pa.Schema, spec: SourceSpec) -> list[str]:
    """The columns a table source reads: its text column(s) (``"title,body"``: each) and its label
    column, picked by name from the source's schema as for files.
    """
    empty = schema.empty_table()
    wanted = spec.text_column
    if wanted is not None and "," in wanted and wanted not in empty.column_names:
        texts = [
            pick_column(empty, w.strip(), TEXT_COLUMNS, "text", spec.uri)
            for w in wanted.split(",")
            if w.strip()
        ]
    else:
        texts = [pick_column(empty, wanted, TEXT_COLUMNS, "text", spec.uri)]
    return list(dict.fromkeys([*texts, pick_label(empty, spec, spec.uri, required=True)]))


def raw_block(part: pa.Table, spec: SourceSpec, first_row: int) -> pa.Table:
    """One block of a source that is not a file (a label column required) as :data:`RAW_SCHEMA`
    rows numbered on from ``first_row``.
    """
    part, text_col = text_columns(part, spec.text_column, spec.uri)
    raw = to_raw(part, text_col, pick_label(part, spec, spec.uri, required=True), spec.uri)
    return renumber(raw, first_row)


def to_raw(table: pa.Table, text_col: str, label_col: str | None, source: str) -> pa.Table:
    n = table.num_rows
    texts, problems = _text_column(table.column(text_col))
    return pa.table(
        {
            "text": texts,
            "label": _as_string(table.column(label_col)) if label_col else pa.nulls(n, pa.string()),
            "source_file": pa.array([source] * n, pa.string()),
            "source_row": pa.array(range(n), pa.int64()),
            "malformed": pa.array(problems, pa.string()),
            "malformed_reason": pa.array(
                [None if p is None else "non_text" for p in problems], pa.string()
            ),
            "source_line": pa.nulls(n, pa.int64()),
            "source_line_end": pa.nulls(n, pa.int64()),
            "raw": pa.nulls(n, pa.string()),
        },
        schema=RAW_SCHEMA,
    )
