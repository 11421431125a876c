"""JSON Lines rows without the text key: ``missing_text_field`` with their raw line and the keys they had.

A JSON Lines file whose text key changes half-way (``text`` then ``review``) reads the later rows with a
null text; without this they would be quarantined as ``empty_text`` and lose what they held.
"""

from __future__ import annotations

import json

import pyarrow as pa

from finetune_assets.data.delimited import RAW_PREFIX_CHARS


def flag_missing_text(raw: pa.Table, lines: list[str], text_key: str) -> pa.Table:
    """Rows of ``raw`` (numbered by ``source_line``, 1-based into ``lines``) whose object has no
    ``text_key`` get ``malformed`` (the keys found), ``malformed_reason`` and ``raw`` (the line)."""
    if text_key.startswith("\x00") or not raw.num_rows:  # several text columns joined: each is optional
        return raw
    cols = {n: raw.column(n).to_pylist() for n in ("text", "malformed", "malformed_reason", "raw",
                                                   "source_line")}
    changed = False
    for i, (text, bad, line) in enumerate(zip(cols["text"], cols["malformed"], cols["source_line"])):
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
        raw = raw.set_column(raw.schema.get_field_index(name), name, pa.array(cols[name], pa.string()))
    return raw
