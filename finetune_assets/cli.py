"""``finetune-assets``: what users do outside the UI (register dataset versions, list them)."""

from __future__ import annotations

import argparse
import os
import sys

from finetune_assets.storage import STORAGE_ROOT_ENV, default_root


def _storage(args):
    from finetune_assets.storage import Storage

    return Storage(args.root or default_root())


def _instance():
    import dagster as dg

    if not os.environ.get("DAGSTER_HOME"):
        sys.exit("DAGSTER_HOME is not set: dataset versions live in the Dagster instance; "
                 "export DAGSTER_HOME=$PWD/.dagster_home (and mkdir it) first")
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    return dg.DagsterInstance.get()


def cmd_versions_add(args) -> int:
    from finetune_assets.data.sources import SourceSpec
    from finetune_assets.versions import register_version

    spec = SourceSpec(uri=args.source, revision=args.revision, text_column=args.text_column,
                      label_column=args.label_column, encoding=args.encoding)
    record = register_version(_instance(), _storage(args), args.key, spec)
    print(f"registered dataset version {record.key} <- {spec.uri}")
    return 0


def cmd_versions_list(args) -> int:
    from finetune_assets.partitions import DATASET_VERSIONS
    from finetune_assets.versions import read_version

    storage = _storage(args)
    for key in _instance().get_dynamic_partitions(DATASET_VERSIONS):
        record = read_version(storage, key)
        print(f"{key}\t{record.source.uri if record else '(no source recorded)'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune-assets", description=__doc__)
    parser.add_argument("--root", help=f"storage root (default ${STORAGE_ROOT_ENV} or ./.finetune_assets)")
    sub = parser.add_subparsers(dest="command", required=True)
    versions = sub.add_parser("versions", help="dataset versions (the partitions of the graph)")
    vsub = versions.add_subparsers(dest="versions_command", required=True)
    add = vsub.add_parser("add", help="register a dataset version and where its reviews come from")
    add.add_argument("key", help="version key, e.g. 2026-11-29 or v3")
    add.add_argument("--source", required=True, help="file/folder/fsspec URL, hf:owner/name, or builtin:sample")
    add.add_argument("--revision")
    add.add_argument("--text-column")
    add.add_argument("--label-column")
    add.add_argument("--encoding", default="utf-8")
    add.set_defaults(func=cmd_versions_add)
    ls = vsub.add_parser("list", help="registered versions and their sources")
    ls.set_defaults(func=cmd_versions_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
