"""``hf:owner/name[:config]`` sources: a Hugging Face dataset split, class ids named by the
dataset's features.

Registration pins the dataset's commit sha (``--revision`` defaults to it, resolved on the hub
with ``huggingface_hub``): every later read loads exactly that commit, whatever was pushed since.
The split (memory-mapped Arrow in the HF cache) is handed on in record batches of about
``block_bytes``. A class id of ``-1`` (HF's "no label", in unlabeled test splits) is a missing
label, quarantined as ``missing_label``, never the last class name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa

from finetune_assets.core.sources.base import PARQUET_ROW_BYTES, SourceError, SourceSpec
from finetune_assets.core.sources.columns import LABEL_COLUMNS, pick_column, raw_block

HF_PREFIX = "hf:"
SHA = re.compile(r"[0-9a-f]{40}")


def parse_hf(uri: str) -> tuple[str, str | None]:
    """(``owner/name``, config or None) of ``hf:owner/name[:config]``."""
    body = uri[len(HF_PREFIX) :]
    name, _, config = body.partition(":")
    if not name or (":" in body and not config):
        raise SourceError(f"{uri}: expected hf:owner/name or hf:owner/name:config")
    return name, config or None


def pin_hf(spec: SourceSpec) -> SourceSpec:
    """The spec at the dataset's commit sha that ``--revision`` (a branch, a tag, or the default
    branch) names now.
    """
    name, _ = parse_hf(spec.uri)
    if spec.revision and SHA.fullmatch(spec.revision):
        return spec
    # lazy, as datasets below: the code location imports every source family; a family's
    # library loads when it is read
    from huggingface_hub import HfApi

    try:
        sha = HfApi().dataset_info(name, revision=spec.revision).sha
    except Exception as err:  # offline, unknown dataset, private without a token
        raise SourceError(
            f"{spec.uri}: cannot resolve the dataset's commit on the hub "
            f"({type(err).__name__}: {_line(err)}); pass --revision with a 40-character commit "
            "sha to register it offline"
        ) from None
    if not sha:
        raise SourceError(f"{spec.uri}: the hub named no commit for revision {spec.revision!r}")
    return replace(spec, revision=sha)


def describe_hf(spec: SourceSpec) -> dict:
    name, config = parse_hf(spec.uri)
    return {"hf_dataset": name, "hf_config": config, "hf_revision": spec.revision}


def _load(spec: SourceSpec):
    import datasets  # lazy: see pin_hf

    name, config = parse_hf(spec.uri)
    try:
        return datasets.load_dataset(name, config, revision=spec.revision, split=spec.hf_split)
    except Exception as err:  # any hub/network failure becomes one clear message
        raise SourceError(f"{spec.uri}: cannot load Hugging Face dataset: {_line(err)}") from None


def iter_hf(spec: SourceSpec, block_bytes: int) -> Iterator[pa.Table]:
    """The split's rows as :data:`RAW_SCHEMA` tables of about ``block_bytes`` each."""
    import datasets  # lazy: see pin_hf

    ds = _load(spec)
    rows = max(1, block_bytes // PARQUET_ROW_BYTES)
    table = ds.data.table  # memory-mapped: batches are slices, not copies
    label_col = pick_column(
        table.schema.empty_table(), spec.label_column, LABEL_COLUMNS, "label", spec.uri
    )
    feature = ds.features.get(label_col)
    names = feature.names if isinstance(feature, datasets.ClassLabel) else None
    row = 0
    for batch in table.to_batches(max_chunksize=rows):
        part = pa.Table.from_batches([batch])
        if names is not None:  # class ids -> their names; -1 is HF's "no label"
            part = part.set_column(
                part.column_names.index(label_col),
                label_col,
                pa.array(
                    [_class(i, names, spec.uri) for i in part.column(label_col).to_pylist()],
                    pa.string(),
                ),
            )
        raw = raw_block(part, spec, row)
        row += raw.num_rows
        yield raw


def _class(i: int | None, names: list[str], uri: str) -> str | None:
    if i is None or i == -1:
        return None
    if not 0 <= i < len(names):
        raise SourceError(f"{uri}: class id {i} is outside the dataset's {len(names)} classes")
    return names[i]


def check_hf(spec: SourceSpec, sample_bytes: int) -> dict[str, int]:
    """The URI parses; the dataset itself is resolved on the hub by :func:`pin_hf`."""
    parse_hf(spec.uri)
    return {}


def _line(err: Exception) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0][:300] if lines else type(err).__name__
