"""Materialize data assets of one dataset version in a separate process (for kill / concurrency
tests).

    python -m finetune_assets_tests.core.prep.materialize_worker ROOT VERSION SOURCE ASSETS
    [--hang-in
    tokens|shards]
        [--marker PATH]

``--hang-in`` makes the write stop half-way inside the asset's publish block (the slice workers'
token parts or MDS sub-datasets written, not yet merged and published), touch ``--marker`` and
sleep: the test then SIGKILLs the process exactly while the attempt folder holds partial data.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def _hang(marker: Path) -> None:
    marker.write_text("partial data written")
    while True:
        time.sleep(1)


def _hang_in_tokens(marker: Path) -> None:
    """Let the slice workers write their token parts into the attempt, then hang before the
    publish.
    """
    import finetune_assets.core.shards.slices as slices

    def hang(*args, **kwargs):
        _hang(marker)

    slices.read_part_stats = hang  # the asset's first step after the fan-out


def _hang_in_shards(marker: Path) -> None:
    """Let the slice workers write their MDS sub-datasets (shards on disk), then hang before the
    merge.
    """
    import finetune_assets.core.shards.slices as slices

    def hang(*args, **kwargs):
        _hang(marker)

    slices.merge_shards = hang


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("version")
    parser.add_argument("source")
    parser.add_argument("assets", help="comma-separated asset keys")
    parser.add_argument("--hang-in", choices=["tokens", "shards"])
    parser.add_argument("--marker", type=Path)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()

    import dagster as dg

    from finetune_assets.core.io.storage import Storage
    from finetune_assets.core.sources import SourceSpec
    from finetune_assets.definitions import build_defs
    from finetune_assets.defs.versions.register import register_version

    if args.hang_in == "tokens":
        _hang_in_tokens(args.marker)
    elif args.hang_in == "shards":
        _hang_in_shards(args.marker)

    defs = build_defs(args.root)
    instance = dg.DagsterInstance.ephemeral()
    register_version(instance, Storage(args.root), args.version, SourceSpec(uri=args.source))
    selection = args.assets.split(",")
    ops = {}
    if "tokenized_reviews" in selection:
        ops["tokenized_reviews"] = {"config": {"max_length": args.max_length}}
    if "mds_shards" in selection:  # small shards, so a kill finds some already flushed to disk
        ops["mds_shards"] = {"config": {"size_limit": "32kb"}}
    result = dg.materialize(
        [a for a in defs.assets if isinstance(a, dg.AssetsDefinition)],
        selection=selection,
        instance=instance,
        partition_key=args.version,
        resources=dict(defs.resources),
        run_config={"ops": ops},
    )
    print("materialized" if result.success else "failed", flush=True)


if __name__ == "__main__":
    main()
