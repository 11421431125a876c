"""Which reader reads a source: a prefix names its family (``hf:``, ``builtin:``); anything else is a file,
a folder or an fsspec URL of them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from finetune_assets.data.sources.base import BLOCK_BYTES, RAW_SCHEMA, SourceSpec
from finetune_assets.data.builtin import BUILTIN_PREFIX
from finetune_assets.data.sources.builtin import check_builtin_source, iter_builtin
from finetune_assets.data.sources.files import check_files, iter_files
from finetune_assets.data.sources.hf import HF_PREFIX, check_hf, iter_hf


@dataclass(frozen=True)
class Family:
    """One kind of source: how its rows stream (bounded blocks of :data:`RAW_SCHEMA`), and how registration
    checks it without reading it all (returns the sampled good rows per file, where it samples)."""

    prefix: str
    iter: Callable[[SourceSpec, int], Iterator[pa.Table]]
    check: Callable[[SourceSpec, int], dict[str, int]]


FILES = Family("", iter_files, check_files)
FAMILIES = (
    Family(BUILTIN_PREFIX, iter_builtin, check_builtin_source),
    Family(HF_PREFIX, iter_hf, check_hf),
)


def family_of(uri: str) -> Family:
    return next((f for f in FAMILIES if uri.startswith(f.prefix)), FILES)


def read_source(spec: SourceSpec) -> pa.Table:
    """All rows of a source as :data:`RAW_SCHEMA` (labels as strings, exactly as found)."""
    tables = list(iter_source(spec))
    return pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()


def iter_source(spec: SourceSpec, block_bytes: int = BLOCK_BYTES) -> Iterator[pa.Table]:
    """The rows of a source in bounded blocks (file order of :func:`list_files`), as :data:`RAW_SCHEMA`.

    Each file is streamed (:func:`iter_file`), so memory is bounded by ``block_bytes``, not by the largest
    file: a version that is one 5 GB CSV reads like one of many small files.
    """
    yield from family_of(spec.uri).iter(spec, block_bytes)


def check_source(spec: SourceSpec, sample_bytes: int = 1 << 20) -> dict[str, int]:
    """Fail now, not at materialization: every file opens, its columns are found and a sample parses.

    Returns the sampled good rows per file. Hugging Face ids are not probed (no network at registration);
    a built-in set is only located (its package installed, its name known).
    """
    return family_of(spec.uri).check(spec, sample_bytes)
