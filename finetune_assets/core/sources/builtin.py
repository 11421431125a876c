"""``builtin:NAME`` sources (:mod:`finetune_assets.core.sources.builtin_sets`) as a source
family.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from finetune_assets.core.sources.base import SourceError, SourceSpec
from finetune_assets.core.sources.builtin_sets import (
    BuiltinSourceError,
    check_builtin,
    read_builtin,
)
from finetune_assets.core.sources.columns import to_raw


def iter_builtin(spec: SourceSpec, block_bytes: int) -> Iterator[pa.Table]:
    try:
        table = read_builtin(spec.uri)
    except BuiltinSourceError as err:
        raise SourceError(str(err)) from err
    yield to_raw(table, "text", "label", spec.uri)


def check_builtin_source(spec: SourceSpec, sample_bytes: int) -> dict[str, int]:
    """Only located (its package installed, its name known)."""
    try:
        check_builtin(spec.uri)
    except BuiltinSourceError as err:
        raise SourceError(str(err)) from err
    return {}
