"""``hf:owner/name`` sources: a Hugging Face dataset split, class ids named by the dataset's
features.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from finetune_assets.data.sources.base import SourceError, SourceSpec
from finetune_assets.data.sources.columns import LABEL_COLUMNS, pick_column, text_columns, to_raw

HF_PREFIX = "hf:"


def read_hf(spec: SourceSpec) -> pa.Table:
    """A Hugging Face dataset split, through ``datasets`` (needs the hub or a local HF cache)."""
    import datasets

    name = spec.uri[len(HF_PREFIX) :]
    try:
        ds = datasets.load_dataset(name, revision=spec.revision, split=spec.hf_split)
    except Exception as err:  # noqa: BLE001 - any hub/network failure becomes one clear message
        raise SourceError(f"{spec.uri}: cannot load Hugging Face dataset: {err}") from err
    label_feature = None
    table = ds.data.table
    table, text_col = text_columns(table, spec.text_column, spec.uri)
    label_col = pick_column(table, spec.label_column, LABEL_COLUMNS, "label", spec.uri)
    label_feature = ds.features.get(label_col)
    if isinstance(label_feature, datasets.ClassLabel):  # class ids -> their names
        names = label_feature.names
        labels = pa.array(
            [None if i is None else names[i] for i in table.column(label_col).to_pylist()]
        )
        table = table.set_column(table.column_names.index(label_col), label_col, labels)
    return to_raw(table, text_col, label_col, spec.uri)


def iter_hf(spec: SourceSpec, block_bytes: int) -> Iterator[pa.Table]:
    yield read_hf(spec)


def check_hf(spec: SourceSpec, sample_bytes: int) -> dict[str, int]:
    """Not probed: registration needs no network."""
    return {}
