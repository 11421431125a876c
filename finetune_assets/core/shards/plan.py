"""Slice plans and their specs: what each slice worker (:mod:`finetune_assets.core.shards.slices`)
reads
and writes.

Specs travel as JSON through storage (the asset writes one, each worker reads it); a part appears
whole or not at all (``storage_files.staged_file``). Dagster-free (test_layers.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import fsspec
import numpy as np

from finetune_assets.core.io.contracts import TOKEN_PARTS_DIR
from finetune_assets.core.io.primitives import write_bytes_atomic

INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by the fan-out runner, as a Kubernetes Indexed Job sets it
PARTS = TOKEN_PARTS_DIR
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
# EX_TEMPFAIL (sysexits.h): a transient I/O error (object store 503, reset, timeout); the Kubernetes
# fan-out retries the index for it (core/launchers/k8s/failures.py) instead of failing it as a code
# error.
TRANSIENT_EXIT_CODE = 75


def part_name(index: int) -> str:
    return f"{index:05d}"


@dataclass(frozen=True)
class TokenizeSpec:
    reviews: str  # URL of raw_reviews' reviews.parquet
    out: str  # staging URL of the tokenized_reviews attempt
    slices: list[list[int]]  # row-group ranges [start, stop) of reviews.parquet, one per index
    tokenizer: str  # URL of a tokenizer.json (no truncation, no padding)
    dtype: str  # token id dtype, e.g. "uint16"
    max_length: int
    labels: dict  # LabelSet.to_dict() of the version
    batch_size: int = 2048
    cache: str | None = (
        None  # TokenCache URL ({root}/token_cache/{tokenizer hash}-{max_length}) or None
    )
    stage: str = "tokenize"
    groups: list[list[int]] | None = (
        None  # per index: the slices [start, stop) it tokenizes; None: one each
    )

    @property
    def count(self) -> int:
        return len(self.groups) if self.groups is not None else len(self.slices)

    def slices_of(self, index: int) -> range:
        return range(*self.groups[index]) if self.groups is not None else range(index, index + 1)


@dataclass(frozen=True)
class ShardsSpec:
    tokens: str  # URL of the tokenized_reviews attempt (its parts/)
    out: str  # staging URL of the mds_shards attempt
    # per index: the token parts [start, stop) it writes, one sub-dataset per part
    groups: list[list[int]]
    size_limit: str | int = "64mb"
    stage: str = "shards"

    @property
    def count(self) -> int:
        return len(self.groups)


# a shard worker pays streaming's import (~1.6 s, ~50 µs a sample): worth it from ~64k rows
SHARD_ROWS_PER_WORKER = 32_000


def group_parts(parts: int, workers: int, rows: int | None = None) -> list[list[int]]:
    """Contiguous ranges of parts (slices), one per worker: a worker pays its imports once, however
    many parts it takes. Shard workers pass ``rows``: streaming's import is worth a second worker
    only from :data:`SHARD_ROWS_PER_WORKER` rows each. Parts are about equal in rows
    (:func:`plan_slices`).
    """
    useful = workers if rows is None else max(1, rows // SHARD_ROWS_PER_WORKER)
    count = max(1, min(parts, workers, useful))
    cuts = [round(k * parts / count) for k in range(count + 1)]
    return [[a, b] for a, b in zip(cuts, cuts[1:])]


def plan_slices(row_group_rows: list[int], workers: int, slice_rows: int) -> list[list[int]]:
    """Contiguous row-group ranges of about equal rows: at least ``workers`` (all cores busy), at
    most ``slice_rows`` rows each where row groups allow (a worker's memory), never more than the
    row groups.

    The count is a multiple of ``workers`` where row groups allow, so no worker idles through a last
    round (5 slices on 2 workers would leave one core idle for a fifth of the step).
    """
    groups = len(row_group_rows)
    if groups == 0:
        return []
    total = int(sum(row_group_rows))
    workers = max(1, workers)
    wanted = max(workers, math.ceil(total / max(1, slice_rows)))
    count = min(groups, math.ceil(wanted / workers) * workers)
    cum = np.concatenate([[0], np.cumsum(row_group_rows)])  # cum[i]: rows before row group i
    cuts = [0]
    for k in range(1, count):
        target = total * k / count
        # cum[i - 1] < target <= cum[i]: cut at the nearer boundary
        i = int(np.searchsorted(cum, target))
        if i > 0 and target - cum[i - 1] < cum[min(i, groups)] - target:
            i -= 1
        cuts.append(min(max(i, cuts[-1] + 1), groups - (count - k)))
    cuts.append(groups)
    return [[a, b] for a, b in zip(cuts, cuts[1:])]


def write_spec(url: str, spec: TokenizeSpec | ShardsSpec) -> None:
    write_bytes_atomic(url, json.dumps(asdict(spec), ensure_ascii=False).encode())


def read_spec(url: str) -> TokenizeSpec | ShardsSpec:
    with fsspec.open(url, "r", encoding="utf-8") as f:
        data = json.load(f)
    return {"tokenize": TokenizeSpec, "shards": ShardsSpec}[data["stage"]](**data)


def read_part_stats(out: str, count: int) -> list[dict]:
    """Every part's stats JSON, in part order; a missing one names the slice."""
    stats = []
    for i in range(count):
        url = f"{out}/{PARTS}/{part_name(i)}.json"
        try:
            with fsspec.open(url, "r") as f:
                stats.append(json.load(f))
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"slice {i}: its worker reported success but wrote no {url}"
            ) from err
    return stats


# -- output helpers: a part appears whole or not at all (storage_files.staged_file) ------------
def _put_json(url: str, data: dict) -> None:
    write_bytes_atomic(url, json.dumps(data, sort_keys=True).encode())
