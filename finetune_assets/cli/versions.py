"""`versions add/remove/list/status`: dataset versions, the partitions of the graph (`status`:
cli/version_status.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from finetune_assets.cli.common import (
    CliError,
    command_group,
    open_instance,
    open_storage,
    print_json,
    when,
)
from finetune_assets.cli.version_status import cmd_versions_status

# Project and third-party modules are imported inside the functions that use them, never
# here: `--help`, and `predict` on a local folder, load neither Dagster nor MLflow
# (cli/__init__.py).


def _source_uri(uri: str) -> str:
    """A local path made absolute (valid from any folder later), also inside ``delta:``."""
    from finetune_assets.core.sources import DELTA_PREFIX, is_file_source

    if uri.startswith(DELTA_PREFIX) and "://" not in uri:
        return DELTA_PREFIX + str(Path(uri[len(DELTA_PREFIX) :]).expanduser().resolve())
    if "://" not in uri and is_file_source(uri):
        return str(Path(uri).expanduser().resolve())
    return uri


def _storage_options(pairs: Sequence[str] | None) -> dict[str, str] | None:
    """``--storage-option KEY=VALUE`` flags as delta-rs' storage options (``env:NAME`` values are
    read from the environment at each read: put secrets there, not on the command line).
    """
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--storage-option {pair!r}: expected KEY=VALUE (nothing registered)")
        out[key.strip()] = value
    return out or None


def _delimiter(value: str | None) -> str | None:
    """``--delimiter`` as one character (``tab`` or ``\\t`` for a tab)."""
    if value is None:
        return None
    value = "\t" if value in ("tab", "\\t") else value
    if len(value) != 1 or value in '"\r\n':
        raise CliError(
            f"--delimiter {value!r}: one character, e.g. ';' or tab (nothing registered)"
        )
    return value


def _escapechar(value: str | None, quoting: str) -> str | None:
    """``--escapechar`` as one character that is not a quote, a line end or blank."""
    if value is None:
        return None
    if len(value) != 1 or value in '"\r\n\t ':
        raise CliError(f"--escapechar {value!r}: one character, e.g. '\\' (nothing registered)")
    if quoting == "none":
        raise CliError("--escapechar needs --quoting minimal (nothing registered)")
    return value


def cmd_versions_add(args) -> int:
    from finetune_assets.core.labels.infer import (
        LabelError,
        label_set_of_source,
        parse_labels_flag,
        parse_mapping_flag,
    )
    from finetune_assets.core.sources import (
        DELTA_PREFIX,
        ICEBERG_PREFIX,
        SQL_PREFIX,
        SourceError,
        SourceSpec,
        check_source,
        pin_source,
    )
    from finetune_assets.defs.versions.register import register_version, source_fingerprint

    uri = _source_uri(args.source)
    if args.where and not uri.startswith((DELTA_PREFIX, SQL_PREFIX, ICEBERG_PREFIX)):
        raise CliError(
            "--where filters delta:, sql: and iceberg: sources only (nothing registered)"
        )
    if args.query and not uri.startswith(SQL_PREFIX):
        raise CliError("--query belongs to sql: sources only (nothing registered)")
    if args.storage_option and not uri.startswith((DELTA_PREFIX, ICEBERG_PREFIX)):
        raise CliError(
            "--storage-option belongs to delta: and iceberg: sources only (nothing registered)"
        )
    spec = SourceSpec(
        uri=uri,
        revision=args.revision,
        text_column=args.text_column,
        label_column=args.label_column,
        encoding=args.encoding,
        where=args.where,
        query=args.query,
        storage_options=_storage_options(args.storage_option),
        delimiter=_delimiter(args.delimiter),
        quoting=args.quoting,
        escapechar=_escapechar(args.escapechar, args.quoting),
    )
    storage = open_storage(args, write=True)
    # source and label set are checked now: a bad or ambiguous one is refused before anything is
    # written
    try:
        sampled = check_source(spec)
        spec = pin_source(spec)  # a Delta version, a SQL content hash: what the key names
        notes: list[str] = []
        labels = label_set_of_source(
            spec,
            parse_labels_flag(args.labels) if args.labels else None,
            parse_mapping_flag(args.label_mapping) if args.label_mapping else None,
            notes=notes,
        )
        fingerprint = source_fingerprint(spec)
        record = register_version(
            open_instance(),
            storage,
            args.key,
            spec,
            fingerprint=fingerprint,
            replace=args.replace,
            labels=labels,
        )
    except (LabelError, SourceError) as err:
        raise CliError(f"{args.source}: {err} (nothing registered)") from err
    files = sampled and not spec.uri.startswith((SQL_PREFIX, ICEBERG_PREFIX))
    checked = f" ({len(sampled)} file(s) checked)" if files else ""
    pinned = f" ({spec.snapshot.split(';db=')[0]})" if spec.snapshot else ""
    print(
        f"registered dataset version {record.key} <- {spec.uri}{pinned}{checked}; "
        f"labels: {labels.describe()}"
    )
    for note in notes:
        print(f"  labels: {note}")
    return 0


def cmd_versions_remove(args) -> int:
    from finetune_assets.defs.versions.register import remove_version

    storage = open_storage(args, write=True)
    kept = remove_version(open_instance(), storage, args.key, force=args.force)
    print(
        f"removed dataset version {args.key}"
        + (f" (published files of {', '.join(kept)} kept under {storage.root})" if kept else "")
    )
    return 0


def cmd_versions_list(args) -> int:
    from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
    from finetune_assets.defs.versions.register import read_version

    storage = open_storage(args)
    rows = []
    for key in open_instance().get_dynamic_partitions(DATASET_VERSIONS):
        record = read_version(storage, key)
        rows.append(
            {
                "version": key,
                "source": record.source.uri if record else None,
                "registered_at": when(record.registered_at)
                if record and record.registered_at
                else None,
                "labels": (record.labels or {}).get("names") if record else None,
            }
        )
    if args.json:
        print_json(rows)
    else:
        for r in rows:
            source = r["source"] or "(no source recorded)"
            print(f"{r['version']}\t{source}\t{r['registered_at'] or ''}".rstrip())
    return 0


def register(sub) -> None:
    """The `versions` group."""
    vsub = command_group(sub, "versions", "dataset versions (the partitions of the graph)")
    _register_add(vsub)
    rm = vsub.add_parser(
        "remove", help="unregister a dataset version (its published files are kept)"
    )
    rm.add_argument("key")
    rm.add_argument(
        "--force", action="store_true", help="remove even though assets of it are materialized"
    )
    rm.set_defaults(func=cmd_versions_remove)
    ls = vsub.add_parser("list", help="registered versions and their sources")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=cmd_versions_list)
    st = vsub.add_parser(
        "status", help="per version and asset: materialized / stale / missing, when, data version"
    )
    st.add_argument("versions", nargs="*", help="versions to show (default: all registered)")
    st.add_argument("--json", action="store_true", help="one JSON object per line")
    st.set_defaults(func=cmd_versions_status)


def _register_add(vsub) -> None:
    add = vsub.add_parser("add", help="register a dataset version and where its reviews come from")
    add.add_argument("key", help="version key, e.g. 2026-11-29 or v3")
    add.add_argument(
        "--source",
        required=True,
        help=(
            "file/folder/fsspec URL, hf:owner/name, builtin:NAME (rotten_tomatoes, imdb, sample), "
            "delta:PATH_OR_URL[@version=N|@timestamp=ISO] or sql:ENV_NAME (a variable holding the "
            "database URL)"
        ),
    )
    add.add_argument(
        "--where",
        help="delta:/sql:/iceberg: row filter, a SQL predicate (in the version)",
    )
    add.add_argument("--query", help="sql: a table name or a SELECT statement")
    add.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="delta: an option for delta-rs' storage (repeatable; in the version), e.g. "
        "AWS_REGION=eu-west-1; VALUE env:NAME reads $NAME at each read (secrets)",
    )
    add.add_argument(
        "--revision", help="hf: a branch, tag or commit (default: the commit the hub has now)"
    )
    add.add_argument("--text-column")
    add.add_argument("--label-column")
    add.add_argument("--encoding", default="utf-8")
    add.add_argument(
        "--quoting",
        choices=["minimal", "none"],
        default="minimal",
        help='CSV/TSV: none for exports that never quote fields (5" screen); in the version',
    )
    add.add_argument(
        "--escapechar",
        help="CSV/TSV: the character that keeps the next one as text, e.g. '\\' for exports "
        'writing \\" for a quote (MySQL, PostgreSQL ESCAPE); in the version',
    )
    add.add_argument(
        "--delimiter",
        help="CSV/TSV field delimiter, e.g. ';' or tab (default: sniffed from a .csv header among "
        ", ; tab |, tab for .tsv; recorded in the version)",
    )
    add.add_argument(
        "--replace",
        action="store_true",
        help="point an already registered key at a different source (only if nothing is "
        "materialized)",
    )
    add.add_argument(
        "--labels",
        help="class names in id order, e.g. Negative,Positive (default: inferred "
        "from the label values; see README 'Labels')",
    )
    add.add_argument(
        "--label-mapping",
        help="raw label -> class, e.g. 0=Negative,1=Positive; "
        "stars-to-sentiment maps 1-5 stars to Negative,Neutral,Positive",
    )
    add.set_defaults(func=cmd_versions_add)
