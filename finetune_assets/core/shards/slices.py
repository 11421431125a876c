"""Slice workers: tokenization and MDS shard writing over slices of a version, one process (or pod)
per slice.

    # the slice index comes from $JOB_COMPLETION_INDEX
    python -m finetune_assets.core.shards.slices work --spec URL

The asset plans the slices (:func:`plan_slices`), writes a spec JSON into its staging attempt and
fans the command out (``core/launchers/fanout.py``: local subprocesses or a Kubernetes Indexed Job).
Workers read and write only through storage URLs (fsspec), one part per slice, a re-run slice
overwriting its own part:

- ``tokenize``: row groups ``[start, stop)`` of ``reviews.parquet`` -> ``{out}/parts/{i:05d}.arrow``
  (token ids, lengths, label id, split) + ``{i:05d}.json`` (counts, token-length histogram, cache
  reuse).
- ``shards``: token parts ``[start, stop)`` -> one MDS sub-dataset per part and split,
  ``{out}/{split}/{part:05d}/`` (a worker takes several parts: streaming's import costs seconds),
  then the asset joins them with streaming's ``merge_index`` into ``{out}/{split}/index.json`` (as
  llm-foundry's converters do).

**Order.** Slices are contiguous ranges of ``reviews.parquet`` row groups and each worker keeps row
order, so part ``i`` precedes part ``i + 1`` and a split's samples are in ``reviews.parquet`` row
order whatever the number of slices or workers: the same samples in the same order (shard boundaries
differ).

**Memory.** A worker holds one slice's keys and cached tokens plus one batch, bounded by
``slice_rows`` and ``batch_size``, not by the version's size; the token cache's index is searched
memory-mapped (page cache, only the pages its binary searches touch), never loaded. One process per
core: the fast tokenizer's own thread pool is switched off (``TOKENIZERS_PARALLELISM=false``),
parallelism comes from the workers. Dagster-free (test_layers.py).
"""

from __future__ import annotations

import argparse
import os
import sys

# The pieces live in slice_plan / slice_tokenize / slice_shards; callers use them through this
# module.
from finetune_assets.core.shards.plan import (
    INDEX_ENV,
    PARTS,
    SHARD_ROWS_PER_WORKER,
    TRANSIENT_EXIT_CODE,
    WORKER_ENV,
    ShardsSpec,
    TokenizeSpec,
    group_parts,
    part_name,
    plan_slices,
    read_part_stats,
    read_spec,
    write_spec,
)
from finetune_assets.core.shards.tokenize_slice import tokenize_group, tokenize_slice
from finetune_assets.core.shards.write_slice import merge_shards, shard_part, shard_slice

__all__ = [
    "INDEX_ENV",
    "PARTS",
    "SHARD_ROWS_PER_WORKER",
    "ShardsSpec",
    "TRANSIENT_EXIT_CODE",
    "TokenizeSpec",
    "WORKER_ENV",
    "group_parts",
    "main",
    "merge_shards",
    "part_name",
    "plan_slices",
    "read_part_stats",
    "read_spec",
    "shard_part",
    "shard_slice",
    "tokenize_group",
    "tokenize_slice",
    "write_spec",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m finetune_assets.core.shards.slices")
    sub = parser.add_subparsers(dest="command", required=True)
    work = sub.add_parser("work", help=f"run slice ${INDEX_ENV} of the spec")
    work.add_argument("--spec", required=True, help="URL of the spec JSON the asset wrote")
    work.add_argument(
        "--index", type=int, default=None, help=f"slice index (default: ${INDEX_ENV})"
    )
    args = parser.parse_args(argv)
    index = args.index if args.index is not None else os.environ.get(INDEX_ENV)
    if index is None:
        parser.error(f"no slice index: set ${INDEX_ENV} (the fan-out runner does) or pass --index")
    spec = read_spec(args.spec)
    index = int(index)
    count = spec.count
    if not 0 <= index < count:
        parser.error(f"slice index {index} is outside 0..{count - 1} of {args.spec}")
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    try:
        (tokenize_group if isinstance(spec, TokenizeSpec) else shard_slice)(spec, index, log)
    except (ConnectionError, TimeoutError) as e:  # the store's hiccup, not this slice's fault
        print(
            f"slice {index}: transient I/O error, exit {TRANSIENT_EXIT_CODE} for a retry: {e!r}",
            file=sys.stderr,
            flush=True,
        )
        return TRANSIENT_EXIT_CODE
    return 0


if __name__ == "__main__":
    os.environ.update({k: v for k, v in WORKER_ENV.items() if k not in os.environ})
    sys.exit(main())
