"""``finetune-assets``: what users do outside the UI: register dataset versions, see their status,
and classify text with a trained model.

Imports are lazy (only the standard library at module level) so ``--help`` and ``predict`` on a
local folder do not pay for Dagster or MLflow.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT_ENV = "FINETUNE_ASSETS_ROOT"  # == finetune_assets.storage.STORAGE_ROOT_ENV (not imported: it pulls in Dagster)
MODEL_SUBDIR = "model"  # the HF folder inside a published finetuned_model attempt
# The graph as users see it in `versions status`; per version unless marked unpartitioned.
PARTITIONED_ASSETS = ("raw_reviews", "tokenized_reviews", "mds_shards", "finetuned_model")
UNPARTITIONED_ASSETS = ("pretrained_model",)


class CliError(Exception):
    """A problem the user can fix; printed as ``error: ...`` with exit status 2."""


def _root(args) -> str:
    return args.root or os.environ.get(ROOT_ENV) or ".finetune_assets"


def _storage(args):
    from finetune_assets.storage import Storage

    return Storage(_root(args))


def _instance():
    import dagster as dg

    if not os.environ.get("DAGSTER_HOME"):
        raise CliError("DAGSTER_HOME is not set: dataset versions live in the Dagster instance; "
                       "export DAGSTER_HOME=$PWD/.dagster_home first (the same one `dagster dev` uses)")
    home = Path(os.environ["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    if not any(home.iterdir()):  # a fresh home: an empty dagster.yaml means defaults, without Dagster's warning
        (home / "dagster.yaml").write_text("")
    return dg.DagsterInstance.get()


# -- versions ----------------------------------------------------------------------------------

def cmd_versions_add(args) -> int:
    from finetune_assets.data.labels import LabelError, label_set_of_source, parse_labels_flag, parse_mapping_flag
    from finetune_assets.data.sources import SourceError, SourceSpec
    from finetune_assets.versions import register_version

    spec = SourceSpec(uri=args.source, revision=args.revision, text_column=args.text_column,
                      label_column=args.label_column, encoding=args.encoding)
    try:  # the label set is read from the source now: an ambiguous one is refused before anything is written
        labels = label_set_of_source(spec, parse_labels_flag(args.labels) if args.labels else None,
                                     parse_mapping_flag(args.label_mapping) if args.label_mapping else None)
        record = register_version(_instance(), _storage(args), args.key, spec, labels=labels)
    except (LabelError, SourceError) as err:
        raise CliError(f"{args.source}: {err}") from err
    print(f"registered dataset version {record.key} <- {spec.uri}; labels: {labels.describe()}")
    return 0


def cmd_versions_list(args) -> int:
    from finetune_assets.partitions import DATASET_VERSIONS
    from finetune_assets.versions import read_version

    storage = _storage(args)
    rows = []
    for key in _instance().get_dynamic_partitions(DATASET_VERSIONS):
        record = read_version(storage, key)
        rows.append({"version": key, "source": record.source.uri if record else None,
                     "registered_at": _when(record.registered_at) if record and record.registered_at else None,
                     "labels": (record.labels or {}).get("names") if record else None})
    if args.json:
        _print_json(rows)
    else:
        for r in rows:
            print(f"{r['version']}\t{r['source'] or '(no source recorded)'}\t{r['registered_at'] or ''}".rstrip())
    return 0


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _latest(instance, asset: str, partition: str | None):
    import dagster as dg

    key = dg.AssetKey(asset)
    target = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]) if partition else key
    records = instance.fetch_materializations(target, limit=1).records
    return records[0] if records else None


def _data_version(record) -> str | None:
    mat = record.asset_materialization if record is not None else None
    return mat.tags.get("dagster/data_version") if mat is not None and mat.tags else None


def _stale_inputs(instance, record, partition: str | None) -> list[str]:
    """Upstream assets whose latest data version differs from the one this materialization consumed.

    Dagster records, per input, a pointer to the upstream event it read
    (``dagster/input_event_pointer/<asset>``); comparing that event's data version with the
    upstream's latest is cheap and needs no code location.
    """
    import dagster as dg

    prefix = "dagster/input_event_pointer/"
    stale = []
    tags = (record.asset_materialization.tags or {}) if record.asset_materialization else {}
    for tag, pointer in tags.items():
        if not tag.startswith(prefix):
            continue
        upstream = tag[len(prefix):]
        latest = _latest(instance, upstream, partition) or _latest(instance, upstream, None)
        if latest is None or str(latest.storage_id) == pointer:
            continue
        consumed = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey.from_user_string(upstream), storage_ids=[int(pointer)]),
            limit=1).records
        if not consumed or _data_version(consumed[0]) != _data_version(latest):
            stale.append(upstream)
    return stale


def version_status(instance, versions: Sequence[str]) -> list[dict]:
    """One row per (version, asset): materialized / stale / missing, when, data version, run."""
    rows = []
    cells = [(None, a) for a in UNPARTITIONED_ASSETS] + [(v, a) for v in versions for a in PARTITIONED_ASSETS]
    for version, asset in cells:
        record = _latest(instance, asset, version)
        row = {"version": version or "-", "asset": asset, "status": "missing", "materialized_at": None,
               "data_version": None, "run_id": None, "stale_because": []}
        if record is not None:
            stale = _stale_inputs(instance, record, version)
            row.update(status="stale" if stale else "materialized", materialized_at=_when(record.timestamp),
                       data_version=_data_version(record), run_id=record.run_id, stale_because=stale)
        rows.append(row)
    return rows


def cmd_versions_status(args) -> int:
    from finetune_assets.partitions import DATASET_VERSIONS

    instance = _instance()
    known = instance.get_dynamic_partitions(DATASET_VERSIONS)
    unknown = [v for v in args.versions if v not in known]
    if unknown:
        raise CliError(f"dataset version(s) not registered: {', '.join(unknown)} "
                       f"(registered: {', '.join(known) or 'none'}; add one with `finetune-assets versions add`)")
    rows = version_status(instance, args.versions or known)
    if args.json:
        _print_json(rows)
        return 0
    header = ("version", "asset", "status", "materialized_at", "data_version", "run")
    table = [header] + [(r["version"], r["asset"],
                         r["status"] + (f" ({', '.join(r['stale_because'])} changed)" if r["stale_because"] else ""),
                         r["materialized_at"] or "-", r["data_version"] or "-", (r["run_id"] or "-")[:8])
                        for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0


# -- predict -----------------------------------------------------------------------------------

def _tracking_uri(args) -> str:
    """Same rule as MlflowResource: explicit, $MLFLOW_TRACKING_URI, else SQLite under the storage root."""
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = _root(args)
    if "://" in root:
        raise CliError(f"storage root {root} is remote: pass --tracking-uri (or set MLFLOW_TRACKING_URI)")
    return f"sqlite:///{Path(root).expanduser().resolve()}/mlflow/mlflow.db"


def _normalize_model_uri(uri: str) -> str:
    """``models:/name/champion`` -> ``models:/name@champion``; numeric versions and ``latest`` stay."""
    if uri.startswith("models:/") and "@" not in uri:
        name, _, ref = uri[len("models:/"):].rpartition("/")
        if name and ref and not ref.isdigit() and ref != "latest":
            return f"models:/{name}@{ref}"
    return uri


def _hf_folder(path: Path) -> Path:
    if not path.exists():
        raise CliError(f"model folder {path} does not exist")
    if (path / MODEL_SUBDIR / "config.json").is_file():  # a finetuned_model attempt folder
        path = path / MODEL_SUBDIR
    if not (path / "config.json").is_file():
        raise CliError(f"{path} is not a Hugging Face model folder (no config.json); "
                       "pass the folder written by save_pretrained")
    return path


class Classifier:
    """A sequence classifier + tokenizer; ``predict`` returns (label, score, scores) per text."""

    def __init__(self, model, tokenizer, source: str):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.source = source
        cfg = model.config
        self.labels = [cfg.id2label.get(i, str(i)) for i in range(cfg.num_labels)]

    @classmethod
    def from_folder(cls, path: Path, source: str | None = None) -> Classifier:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = _hf_folder(path)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True)
        return cls(model, tokenizer, source or str(folder))

    def predict(self, texts: Sequence[str], max_length: int) -> list[tuple[str, float, dict[str, float]]]:
        import torch

        from finetune_assets.data.models import position_limit

        limit = min(max_length, position_limit(self.model.config))
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=limit, return_tensors="pt")
        with torch.inference_mode():
            probs = torch.softmax(self.model(**enc).logits.float(), dim=-1)
        out = []
        for row in probs.tolist():
            best = max(range(len(row)), key=row.__getitem__)
            out.append((self.labels[best], row[best], dict(zip(self.labels, row))))
        return out


def load_classifier(args) -> Classifier:
    """The model chosen by --version / --model-uri / --model (exactly one)."""
    chosen = [o for o in ("version", "model_uri", "model") if getattr(args, o)]
    if len(chosen) != 1:
        raise CliError("choose the model with exactly one of --version V, --model-uri models:/name@alias, "
                       "or --model PATH")
    if args.model:
        return Classifier.from_folder(Path(args.model).expanduser())
    if args.version:
        return _classifier_for_version(args)
    return _classifier_for_uri(args)


def _classifier_for_version(args) -> Classifier:
    from finetune_assets.partitions import validate_version_key
    from finetune_assets.storage import Storage

    version = validate_version_key(args.version)
    storage = Storage(_root(args))
    published = storage.current("finetuned_model", version)
    if published is None:
        from finetune_assets.versions import read_version

        hint = ("it is registered but finetuned_model has not been materialized; run "
                f"`dagster asset materialize -m finetune_assets.definitions --select '*' --partition {version}`"
                if read_version(storage, version) is not None else
                "it is not registered; see `finetune-assets versions list`")
        raise CliError(f"no trained model for dataset version {version!r} under {storage.root}: {hint}")
    if storage.is_local:
        return Classifier.from_folder(Path(published.url), source=f"finetuned_model[{version}] {published.url}")
    import tempfile

    tmp = tempfile.mkdtemp(prefix="finetune-assets-model-")
    storage.fs.get(f"{published.url}/{MODEL_SUBDIR}/", tmp + "/", recursive=True)
    return Classifier.from_folder(Path(tmp), source=f"finetuned_model[{version}] {published.url}")


def _classifier_for_uri(args) -> Classifier:
    import mlflow

    uri = _normalize_model_uri(args.model_uri)
    mlflow.set_tracking_uri(_tracking_uri(args))
    mlflow.set_registry_uri(_tracking_uri(args))
    try:
        components = mlflow.transformers.load_model(uri, return_type="components", device=-1)
    except mlflow.exceptions.MlflowException as err:
        raise CliError(f"cannot load {uri} from {_tracking_uri(args)}: {err.message}") from err
    return Classifier(components["model"], components["tokenizer"], source=uri)


def _texts_from_file(path: Path, column: str | None, encoding: str) -> list[str]:
    import csv
    import json

    if not path.is_file():
        raise CliError(f"input file {path} does not exist")
    suffix = path.suffix.lower()
    with path.open(encoding=encoding, newline="") as f:
        if suffix in (".jsonl", ".ndjson"):
            texts = []
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise CliError(f"{path}:{n}: not valid JSON ({err.msg})") from err
                if isinstance(obj, str):
                    texts.append(obj)
                elif isinstance(obj, dict) and isinstance(obj.get(column or "text"), str):
                    texts.append(obj[column or "text"])
                else:
                    raise CliError(f"{path}:{n}: expected a string or an object with a {column or 'text'!r} string")
            return texts
        if suffix in (".csv", ".tsv"):
            reader = csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ",")
            fields = reader.fieldnames or []
            name = column or ("text" if "text" in fields else fields[0] if len(fields) == 1 else None)
            if name not in fields:
                raise CliError(f"{path}: no column {column or 'text'!r} (columns: {', '.join(fields)}); "
                               "choose one with --text-column")
            return [row[name] for row in reader if (row.get(name) or "").strip()]
        return [line.rstrip("\r\n") for line in f if line.strip()]


def _batches(texts: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(texts), size):
        yield texts[start:start + size]


def _print_json(obj) -> None:
    import json

    if isinstance(obj, list):
        for item in obj:
            print(json.dumps(item, ensure_ascii=False))
    else:
        print(json.dumps(obj, ensure_ascii=False))


def cmd_predict(args) -> int:
    import json

    if args.batch_size < 1:
        raise CliError("--batch-size must be at least 1")
    if args.file:
        if args.text:
            raise CliError("give text arguments or --file, not both")
        texts = _texts_from_file(Path(args.file), args.text_column, args.encoding)
    elif args.text:
        texts = list(args.text)
    elif not sys.stdin.isatty():
        texts = [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
    else:
        raise CliError("nothing to classify: pass text as arguments, --file PATH, or pipe lines on stdin")
    if not texts:
        raise CliError("nothing to classify: the input has no non-empty lines")
    classifier = load_classifier(args)
    show_progress = args.file is not None and not args.no_progress
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(texts), unit="text", desc="classifying", file=sys.stderr, dynamic_ncols=True)
    try:
        for batch in _batches(texts, args.batch_size):
            for text, (label, score, scores) in zip(batch, classifier.predict(batch, args.max_length)):
                if args.json:
                    print(json.dumps({"text": text, "label": label, "score": round(score, 6),
                                      "scores": {k: round(v, 6) for k, v in scores.items()}}, ensure_ascii=False))
                else:
                    print(f"{label}\t{score:.4f}\t{text}")
            if bar is not None:
                bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    return 0


# -- entry point -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune-assets", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", help=f"storage root (default ${ROOT_ENV} or ./.finetune_assets)")
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
    add.add_argument("--labels", help="class names in id order, e.g. Negative,Positive (default: inferred "
                                      "from the label values; see README 'Labels')")
    add.add_argument("--label-mapping", help="raw label -> class, e.g. 0=Negative,1=Positive; "
                                             "stars-to-sentiment maps 1-5 stars to Negative,Neutral,Positive")
    add.set_defaults(func=cmd_versions_add)
    ls = vsub.add_parser("list", help="registered versions and their sources")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=cmd_versions_list)
    st = vsub.add_parser("status", help="per version and asset: materialized / stale / missing, when, data version")
    st.add_argument("versions", nargs="*", help="versions to show (default: all registered)")
    st.add_argument("--json", action="store_true", help="one JSON object per line")
    st.set_defaults(func=cmd_versions_status)

    pr = sub.add_parser(
        "predict", help="classify text with a trained model",
        description="Classify text: prints label, score and text per input (tab separated), or JSON lines.",
        epilog="examples:\n"
               "  finetune-assets predict --version sample 'a fine product'\n"
               "  finetune-assets predict --model-uri models:/review-classifier@champion --file reviews.csv\n"
               "  cat reviews.txt | finetune-assets predict --model path/to/model --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    pr.add_argument("text", nargs="*", help="texts to classify (default: lines from stdin)")
    src = pr.add_argument_group("model (choose one)")
    src.add_argument("--version", help="the finetuned_model of this dataset version under the storage root")
    src.add_argument("--model-uri", help="MLflow model URI: models:/name@alias, models:/name/3, runs:/ID/model")
    src.add_argument("--model", help="a local Hugging Face model folder (save_pretrained output)")
    src.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or the "
                                            "SQLite store under the storage root)")
    inp = pr.add_argument_group("input")
    inp.add_argument("--file", help="CSV/TSV (column --text-column, default 'text'), JSONL, or TXT (one per line)")
    inp.add_argument("--text-column", help="column or JSON key holding the text (default: text)")
    inp.add_argument("--encoding", default="utf-8", help="encoding of --file (e.g. cp1256)")
    pr.add_argument("--batch-size", type=int, default=32)
    pr.add_argument("--max-length", type=int, default=512, help="truncate inputs to this many tokens")
    pr.add_argument("--json", action="store_true", help="JSON lines with text, label, score and all scores")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar for --file")
    pr.set_defaults(func=cmd_predict)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
