"""`benchmarks add/list`: labelled sets that never train; every new model is scored on them."""

from __future__ import annotations

from finetune_assets.cli.common import (
    command_group,
    open_storage,
    parse_label_mapping,
    print_json,
)

# Project and third-party modules are imported inside the functions that use them, never
# here: `--help`, and `predict` on a local folder, load neither Dagster nor MLflow
# (cli/__init__.py).


def cmd_benchmarks_add(args) -> int:
    from finetune_assets.core.evaluation.benchmark_sets import add_benchmark_set
    from finetune_assets.core.sources import SourceSpec
    from finetune_assets.core.versions.keys import validate_version_key

    name = validate_version_key(args.name)  # the same rule as version keys: it becomes a path
    spec = SourceSpec(
        uri=args.source,
        text_column=args.text_column,
        label_column=args.label_column,
        encoding=args.encoding,
    )
    record = add_benchmark_set(
        open_storage(args), name, spec, parse_label_mapping(args.label_mapping)
    )
    counts = ", ".join(f"{k} {v}" for k, v in sorted(record["label_counts"].items()))
    print(
        f"registered benchmark set {name} <- {spec.uri}: {record['rows']} reviews ({counts}); "
        "benchmark_scores scores every new model on it"
    )
    return 0


def cmd_benchmarks_list(args) -> int:
    from finetune_assets.core.evaluation.benchmark_sets import list_benchmark_sets

    storage = open_storage(args)
    rows = []
    for name in list_benchmark_sets(storage):
        meta = storage.current("benchmark_sets", name).metadata
        rows.append(
            {
                "name": name,
                "source": meta.get("source"),
                "rows": meta.get("rows"),
                "label_counts": meta.get("label_counts"),
            }
        )
    if args.json:
        print_json(rows)
    else:
        for r in rows:
            print(f"{r['name']}\t{r['rows']}\t{r['source']}")
    return 0


def register(sub) -> None:
    """The `benchmarks` group."""
    bsub = command_group(
        sub, "benchmarks", "labelled sets that never train; every new model is scored on them"
    )
    badd = bsub.add_parser("add", help="register (freeze) a labelled file as a benchmark set")
    badd.add_argument("name", help="set name (1-63 of [A-Za-z0-9._-])")
    badd.add_argument(
        "--source",
        required=True,
        help="labelled file or folder (CSV/TSV/JSONL/Parquet, fsspec URL)",
    )
    badd.add_argument(
        "--label-mapping", help="raw label -> class: JSON object or RAW=Class,RAW=Class"
    )
    badd.add_argument("--text-column")
    badd.add_argument("--label-column")
    badd.add_argument("--encoding", default="utf-8")
    badd.set_defaults(func=cmd_benchmarks_add)
    bls = bsub.add_parser("list", help="registered benchmark sets")
    bls.add_argument("--json", action="store_true")
    bls.set_defaults(func=cmd_benchmarks_list)
