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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# == finetune_assets.storage.STORAGE_ROOT_ENV; not imported at module level (storage is Dagster-free but pulls
# in fsspec), so `--help` stays fast; the commands import storage and contracts where they need them.
ROOT_ENV = "FINETUNE_ASSETS_ROOT"


class CliError(Exception):
    """A problem the user can fix; printed as ``error: ...`` with exit status 2."""


def _root(args) -> str:
    from finetune_assets.storage import default_root

    return args.root or default_root()


def _storage(args, write: bool = False):
    from finetune_assets.storage import Storage

    root = _root(args)
    if "://" not in root and (write or Path(root).expanduser().is_file()):
        _check_writable_dir(Path(root).expanduser(), f"storage root {root}",
                            f"--root or ${ROOT_ENV}")
    return Storage(root)


def _check_writable_dir(path: Path, what: str, fix: str) -> None:
    """A folder we will write into: not a file, and (it or its nearest existing parent) writable."""
    if path.exists() and not path.is_dir():
        raise CliError(f"{what} is a file, not a folder: point {fix} at a folder")
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise CliError(f"{what}: {probe} is a file, so the folder cannot be created; point {fix} at a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise CliError(f"{what}: {probe} is not writable by this user; point {fix} at a writable folder")


def _instance():
    import dagster as dg

    if not os.environ.get("DAGSTER_HOME"):
        raise CliError("DAGSTER_HOME is not set: dataset versions live in the Dagster instance; "
                       "export DAGSTER_HOME=$PWD/.dagster_home first (the same one `dagster dev` uses)")
    home = Path(os.environ["DAGSTER_HOME"])
    if not home.is_absolute():
        raise CliError(f"DAGSTER_HOME={home} is relative; Dagster needs an absolute path: "
                       f"export DAGSTER_HOME={Path(home).resolve()}")
    _check_writable_dir(home, f"DAGSTER_HOME {home}", "DAGSTER_HOME")
    home.mkdir(parents=True, exist_ok=True)
    if not any(home.iterdir()):  # a fresh home: an empty dagster.yaml means defaults, without Dagster's warning
        (home / "dagster.yaml").write_text("")
    return dg.DagsterInstance.get()


# -- versions ----------------------------------------------------------------------------------

def cmd_versions_add(args) -> int:
    from finetune_assets.data.labels import LabelError, label_set_of_source, parse_labels_flag, parse_mapping_flag
    from finetune_assets.data.sources import SourceError, SourceSpec, check_source
    from finetune_assets.dataset_versions.registry import register_version, source_fingerprint

    uri = args.source
    if "://" not in uri and not uri.startswith(("hf:", "builtin:")):  # a local path: valid from any folder later
        uri = str(Path(uri).expanduser().resolve())
    spec = SourceSpec(uri=uri, revision=args.revision, text_column=args.text_column,
                      label_column=args.label_column, encoding=args.encoding)
    storage = _storage(args, write=True)
    try:  # source and label set are checked now: a bad or ambiguous one is refused before anything is written
        sampled = check_source(spec)
        labels = label_set_of_source(spec, parse_labels_flag(args.labels) if args.labels else None,
                                     parse_mapping_flag(args.label_mapping) if args.label_mapping else None)
        fingerprint = source_fingerprint(spec)
        record = register_version(_instance(), storage, args.key, spec, fingerprint=fingerprint,
                                  replace=args.replace, labels=labels)
    except (LabelError, SourceError) as err:
        raise CliError(f"{args.source}: {err} (nothing registered)") from err
    checked = f" ({len(sampled)} file(s) checked)" if sampled else ""
    print(f"registered dataset version {record.key} <- {spec.uri}{checked}; labels: {labels.describe()}")
    return 0


def cmd_versions_remove(args) -> int:
    from finetune_assets.dataset_versions.registry import remove_version

    storage = _storage(args, write=True)
    kept = remove_version(_instance(), storage, args.key, force=args.force)
    print(f"removed dataset version {args.key}"
          + (f" (published files of {', '.join(kept)} kept under {storage.root})" if kept else ""))
    return 0


def cmd_versions_list(args) -> int:
    from finetune_assets.dataset_versions.partitions import DATASET_VERSIONS
    from finetune_assets.dataset_versions.registry import read_version

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


def stale_resolver(instance, root: str):
    """Dagster's own staleness (the UI's "stale" flags, GraphQL ``staleStatus``) over the code
    location's asset graph: code versions (config defaults folded in), recorded input data versions."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver
    from dagster._core.loader import LoadingContext

    from finetune_assets.definitions import build_defs

    class _Loading(LoadingContext):  # a cache holder per command (the webserver: one per request)
        def __init__(self, inst):
            self._instance, self._loaders = inst, {}

        @property
        def instance(self):
            return self._instance

        @property
        def loaders(self):
            return self._loaders

    graph = build_defs(root).resolve_asset_graph()
    return CachingStaleStatusResolver(instance, graph, _Loading(instance))


def _stale_because(resolver, asset: str, partition: str | None) -> list[str]:
    """Dagster's stale causes, each as "<asset>: <reason>" (the asset itself for a code change)."""
    import dagster as dg
    from dagster._core.definitions.data_version import StaleStatus

    key = dg.AssetKey(asset)
    if resolver.get_status(key, partition) != StaleStatus.STALE:
        return []
    causes = []
    for cause in resolver.get_stale_causes(key, partition):
        where = (cause.dependency or cause.key).asset_key.to_user_string()
        text = f"{where}: {cause.reason}"
        if text not in causes:
            causes.append(text)
    return causes


def version_status(instance, versions: Sequence[str], resolver) -> list[dict]:
    """One row per (version, asset): materialized / stale / missing, when, data version, run.

    "stale" is Dagster's judgement (``resolver``: ``stale_resolver``), never a rule of our own.
    """
    from finetune_assets.sensors import STATUS_TAG

    from finetune_assets.contracts import PARTITIONED_ASSETS, PRETRAINED_MODEL

    rows = []
    # The graph as users see it in `versions status`: the unpartitioned base model, then per version.
    cells = [(None, PRETRAINED_MODEL)] + [(v, a) for v in versions for a in PARTITIONED_ASSETS]
    failed = {v: _failed_last_run(instance, v) for v in versions}
    for version, asset in cells:
        record = _latest(instance, asset, version)
        row = {"version": version or "-", "asset": asset, "status": "missing", "materialized_at": None,
               "data_version": None, "run_id": None, "stale_because": []}
        if record is not None:
            stale = _stale_because(resolver, asset, version)
            row.update(status="stale" if stale else "materialized", materialized_at=_when(record.timestamp),
                       data_version=_data_version(record), run_id=record.run_id, stale_because=stale)
        elif version is not None and failed.get(version) is not None:
            run = failed[version]  # never materialized and the version's latest run failed: say so, not "missing"
            row.update(status="failed", run_id=run.run_id, detail=run.tags.get(STATUS_TAG, ""))
        rows.append(row)
    return rows


def _failed_last_run(instance, version: str):
    """The version's most recent run if it failed or was cancelled (the sensor's retry rule may tag it)."""
    import dagster as dg

    records = instance.get_run_records(dg.RunsFilter(tags={"dagster/partition": version}), limit=1)
    run = records[0].dagster_run if records else None
    return run if run is not None and run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED) else None


def cmd_versions_status(args) -> int:
    from finetune_assets.dataset_versions.partitions import DATASET_VERSIONS

    instance = _instance()
    known = instance.get_dynamic_partitions(DATASET_VERSIONS)
    unknown = [v for v in args.versions if v not in known]
    if unknown:
        raise CliError(f"dataset version(s) not registered: {', '.join(unknown)} "
                       f"(registered: {', '.join(known) or 'none'}; add one with `finetune-assets versions add`)")
    rows = version_status(instance, args.versions or known, stale_resolver(instance, _root(args)))
    if args.json:
        _print_json(rows)
        return 0
    header = ("version", "asset", "status", "materialized_at", "data_version", "run")
    table = [header] + [(r["version"], r["asset"],
                         r["status"] + (f" ({'; '.join(r['stale_because'])})"
                                        if r["stale_because"] else ""),
                         r["materialized_at"] or "-", r["data_version"] or "-", (r["run_id"] or "-")[:8])
                        for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0


# -- predict -----------------------------------------------------------------------------------

def _tracking_uri(args) -> str:
    """The rule of ``finetune_assets.tracking``, its embedded store under the storage root (as MlflowResource)."""
    from finetune_assets.tracking import tracking_uri

    root = _root(args)
    try:
        return tracking_uri(args.tracking_uri, f"{root.rstrip('/')}/mlflow",
                            "pass --tracking-uri (or set MLFLOW_TRACKING_URI)")
    except ValueError as err:
        raise CliError(str(err)) from None


def _normalize_model_uri(uri: str) -> str:
    """``models:/name/champion`` -> ``models:/name@champion``; numeric versions and ``latest`` stay."""
    if uri.startswith("models:/") and "@" not in uri:
        name, _, ref = uri[len("models:/"):].rpartition("/")
        if name and ref and not ref.isdigit() and ref != "latest":
            return f"models:/{name}@{ref}"
    return uri


def _from_folder(path: Path, source: str | None = None):
    """``inference.Classifier`` from a folder; a folder without a model is a user error."""
    from finetune_assets.inference import Classifier, ModelFolderError

    try:
        return Classifier.from_folder(path, source)
    except ModelFolderError as err:
        raise CliError(str(err)) from err


def load_classifier(args):
    """The model chosen by --version / --model-uri / --model (exactly one)."""
    chosen = [o for o in ("version", "model_uri", "model") if getattr(args, o)]
    if len(chosen) != 1:
        raise CliError("choose the model with exactly one of --version V, --model-uri models:/name@alias, "
                       "or --model PATH")
    if getattr(args, "baseline", False):
        if not args.version:
            raise CliError("--baseline scores the baseline_model of a dataset version: pass --version V")
        return _baseline_for_version(args)
    if args.model:
        return _from_folder(Path(args.model).expanduser())
    if args.version:
        return _classifier_for_version(args)
    return _classifier_for_uri(args)


def _classifier_for_version(args):
    from finetune_assets.contracts import FINETUNED_MODEL
    from finetune_assets.dataset_versions.partitions import validate_version_key
    from finetune_assets.storage import Storage

    version = validate_version_key(args.version)
    storage = Storage(_root(args))
    published = storage.current(FINETUNED_MODEL, version)
    if published is None:
        from finetune_assets.dataset_versions.registry import read_version

        hint = ("it is registered but finetuned_model has not been materialized; run "
                f"`dagster asset materialize -m finetune_assets.definitions --select '*' --partition {version}`"
                if read_version(storage, version) is not None else
                "it is not registered; see `finetune-assets versions list`")
        raise CliError(f"no trained model for dataset version {version!r} under {storage.root}: {hint}")
    if storage.is_local:
        return _from_folder(Path(published.url), source=f"finetuned_model[{version}] {published.url}")
    import tempfile

    tmp = tempfile.mkdtemp(prefix="finetune-assets-model-")
    from finetune_assets.contracts import MODEL_SUBDIR

    storage.fs.get(f"{published.url}/{MODEL_SUBDIR}/", tmp + "/", recursive=True)
    return _from_folder(Path(tmp), source=f"finetuned_model[{version}] {published.url}")


def _baseline_for_version(args):
    """baseline_model[v]: TF-IDF + logistic regression, with the same ``predict`` as ``inference.Classifier``."""
    from finetune_assets.contracts import BASELINE_MODEL
    from finetune_assets.data.baseline import BaselineModel
    from finetune_assets.dataset_versions.partitions import validate_version_key
    from finetune_assets.storage import Storage

    version = validate_version_key(args.version)
    storage = Storage(_root(args))
    published = storage.current(BASELINE_MODEL, version)
    if published is None:
        raise CliError(f"no baseline_model for dataset version {version!r} under {storage.root}; materialize it "
                       f"with `dagster asset materialize -m finetune_assets.definitions --select baseline_model "
                       f"--partition {version}`")
    with storage.local_copy(published.url) as local:
        return BaselineModel.load(Path(local), source=f"baseline_model[{version}] {published.url}")


def _classifier_for_uri(args):
    from finetune_assets.inference import Classifier

    import mlflow

    uri = _normalize_model_uri(args.model_uri)
    mlflow.set_tracking_uri(_tracking_uri(args))
    mlflow.set_registry_uri(_tracking_uri(args))
    try:
        components = mlflow.transformers.load_model(uri, return_type="components", device=-1)
    except mlflow.exceptions.MlflowException as err:
        raise CliError(f"cannot load {uri} from {_tracking_uri(args)}: {err.message}") from err
    return Classifier(components["model"], components["tokenizer"], source=uri)


@dataclass
class InputRow:
    """One input to classify: where it came from, its text, and why it cannot be classified (if so)."""

    where: str
    text: str | None
    error: str | None = None


def _check_text(row: InputRow) -> InputRow:
    from finetune_assets.data.validate import normalize_text

    if row.error is None and (row.text is None or not normalize_text(row.text)):
        row.error = ("empty_text: only invisible characters" if row.text and row.text.strip()
                     else "empty_text: no text")
    return row


def _rows_from_file(path: Path, column: str | None, encoding: str) -> tuple[list[InputRow], int]:
    """Rows of --file, read by the same readers as dataset sources; (rows, blank lines skipped in TXT)."""
    from finetune_assets.data.sources import SourceError, SourceSpec, decode, file_format, read_bytes, read_file

    if not path.is_file():
        raise CliError(f"input file {path} does not exist" if not path.exists() else f"input {path} is not a file")
    try:
        if file_format(str(path)) is None:  # plain text: one review per line
            text = decode(str(path), read_bytes(str(path)), encoding)
            lines = text.replace("\r\n", "\n").split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            rows = [_check_text(InputRow(f"{path}:{i}", line)) for i, line in enumerate(lines, 1) if line.strip()]
            return rows, sum(1 for line in lines if not line.strip())
        table = read_file(str(path), SourceSpec(uri=str(path), text_column=column, encoding=encoding),
                          require_label=False)
    except SourceError as err:
        raise CliError(f"{err} (predict: choose the column with --text-column, the encoding with --encoding)") from err
    rows = []
    for r in table.select(["text", "source_row", "source_line", "malformed", "malformed_reason"]).to_pylist():
        where = f"{path}:{r['source_line']}" if r["source_line"] else f"{path} row {r['source_row'] + 1}"
        error = f"{r['malformed_reason']}: {r['malformed']}" if r["malformed"] else None
        rows.append(_check_text(InputRow(where, r["text"], error)))
    return rows, 0


def _escape_tsv(text: str) -> str:
    """One physical line whatever the text: backslash, tab, CR and LF escaped."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")


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
    skipped = 0
    if args.file:
        if args.text:
            raise CliError("give text arguments or --file, not both")
        rows, skipped = _rows_from_file(Path(args.file), args.text_column, args.encoding)
    elif args.text:
        rows = [_check_text(InputRow(f"argument {i}", t)) for i, t in enumerate(args.text, 1)]
    elif not sys.stdin.isatty():
        lines = [line.rstrip("\r\n").lstrip("\ufeff") if i == 1 else line.rstrip("\r\n")
                 for i, line in enumerate(sys.stdin, 1)]
        rows = [_check_text(InputRow(f"stdin:{i}", t)) for i, t in enumerate(lines, 1) if t.strip()]
        skipped = sum(1 for t in lines if not t.strip())
    else:
        raise CliError("nothing to classify: pass text as arguments, --file PATH, or pipe lines on stdin")
    if not rows:
        raise CliError("nothing to classify: the input has no non-empty lines")
    if skipped:
        print(f"note: {skipped} blank line(s) skipped (one review per line)", file=sys.stderr)
    fmt = "jsonl" if args.json else args.format
    if fmt == "auto":  # a terminal gets readable columns; a pipe or file gets JSON lines, safe for any text
        fmt = "tsv" if sys.stdout.isatty() else "jsonl"
    classifier = load_classifier(args)
    todo = [r for r in rows if r.error is None]
    show_progress = args.file is not None and not args.no_progress
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="text", desc="classifying", file=sys.stderr, dynamic_ncols=True)
    from finetune_assets.data.batching import predict_in_length_order

    try:
        outputs = predict_in_length_order(lambda batch: classifier.predict(batch, args.max_length),
                                          [r.text for r in todo], args.batch_size,
                                          on_batch=bar.update if bar is not None else None)
        results = {id(row): out for row, out in zip(todo, outputs)}
    finally:
        if bar is not None:
            bar.close()
    errors = 0
    for row in rows:
        if row.error is not None:
            errors += 1
            print(f"error: {row.where}: {row.error}", file=sys.stderr)
            if fmt == "jsonl":
                print(json.dumps({"text": row.text, "error": row.error, "where": row.where}, ensure_ascii=False))
            else:
                print(f"ERROR\t\t{_escape_tsv(row.text or '')}")
            continue
        label, score, scores = results[id(row)]
        if fmt == "jsonl":
            print(json.dumps({"text": row.text, "label": label, "score": round(score, 6),
                              "scores": {k: round(v, 6) for k, v in scores.items()}}, ensure_ascii=False))
        else:
            print(f"{label}\t{score:.4f}\t{_escape_tsv(row.text)}")
    if errors:
        print(f"error: {errors} of {len(rows)} input row(s) could not be classified (see the lines above)",
              file=sys.stderr)
        return 1
    return 0


# -- evaluate, benchmarks, summary (issue 14) ---------------------------------------------------

def _label_mapping(text: str | None) -> dict[str, str] | None:
    """``--label-mapping '{"pos": "Positive"}'`` or ``pos=Positive,neg=Negative``."""
    import json

    if not text:
        return None
    if text.lstrip().startswith("{"):
        try:
            mapping = json.loads(text)
        except json.JSONDecodeError as err:
            raise CliError(f"--label-mapping is not valid JSON: {err.msg}") from err
        if not isinstance(mapping, dict):
            raise CliError("--label-mapping must be a JSON object: raw label -> class name")
        return {str(k): str(v) for k, v in mapping.items()}
    pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
    if any(len(p) != 2 for p in pairs):
        raise CliError("--label-mapping takes RAW=Class pairs separated by commas, or a JSON object")
    return {k.strip(): v.strip() for k, v in pairs}


def cmd_evaluate(args) -> int:
    from finetune_assets.benchmark_sets import read_labelled
    from finetune_assets.data.evaluate import format_report, map_labels, scores
    from finetune_assets.data.sources import SourceSpec

    if args.batch_size < 1:
        raise CliError("--batch-size must be at least 1")
    mapping = _label_mapping(args.label_mapping)
    spec = SourceSpec(uri=args.file, text_column=args.text_column, label_column=args.label_column,
                      encoding=args.encoding)
    texts, raw_labels = read_labelled(spec)
    classifier = load_classifier(args)
    truth = map_labels(raw_labels, mapping, classifier.labels, where=args.file)
    predicted = classifier.predict_labels(texts, args.max_length, args.batch_size)
    result = {"model": classifier.source, "file": args.file, **scores(truth, predicted, classifier.labels)}
    if args.json:
        _print_json(result)
    else:
        print(f"model     {result['model']}\nfile      {args.file}")
        print(format_report(result))
    return 0


def cmd_benchmarks_add(args) -> int:
    from finetune_assets.benchmark_sets import add_benchmark_set
    from finetune_assets.data.sources import SourceSpec
    from finetune_assets.dataset_versions.partitions import validate_version_key

    name = validate_version_key(args.name)  # the same rule as version keys: it becomes a path
    spec = SourceSpec(uri=args.source, text_column=args.text_column, label_column=args.label_column,
                      encoding=args.encoding)
    record = add_benchmark_set(_storage(args), name, spec, _label_mapping(args.label_mapping))
    counts = ", ".join(f"{k} {v}" for k, v in sorted(record["label_counts"].items()))
    print(f"registered benchmark set {name} <- {spec.uri}: {record['rows']} reviews ({counts}); "
          "benchmark_scores scores every new model on it")
    return 0


def cmd_benchmarks_list(args) -> int:
    from finetune_assets.benchmark_sets import list_benchmark_sets

    storage = _storage(args)
    rows = []
    for name in list_benchmark_sets(storage):
        meta = storage.current("benchmark_sets", name).metadata
        rows.append({"name": name, "source": meta.get("source"), "rows": meta.get("rows"),
                     "label_counts": meta.get("label_counts")})
    if args.json:
        _print_json(rows)
    else:
        for r in rows:
            print(f"{r['name']}\t{r['rows']}\t{r['source']}")
    return 0


def version_summary(storage, version: str, tracking_uri: str | None) -> dict:
    """What the first command ends with: rows, test scores of fine-tuned / baseline / majority, champion or not."""
    from finetune_assets.contracts import (BASELINE_MODEL, FINETUNED_MODEL, RAW_REVIEWS, TOKENIZED_REVIEWS,
                                           read_token_stats, read_training_result)
    from finetune_assets.data.baseline import INFO_FILE

    raw, tokens = storage.current(RAW_REVIEWS, version), storage.current(TOKENIZED_REVIEWS, version)
    model, base = storage.current(FINETUNED_MODEL, version), storage.current(BASELINE_MODEL, version)
    out: dict = {"version": version, "rows": raw.metadata.get("rows") if raw else None,
                 "rejected": raw.metadata.get("rejected") if raw else None}
    out["splits"] = read_token_stats(tokens.url, storage.fs).splits if tokens else None
    try:
        result = read_training_result(model.url, storage.fs) if model else None
    except FileNotFoundError:  # a model folder published without the trainer's result: no scores to show
        result = None
    out["finetuned"] = {"accuracy": result.accuracy, "macro_f1": result.macro_f1} if result else None
    info = storage.read_json(f"{base.url}/{INFO_FILE}") if base else None
    test = (info or {}).get("test")
    out["baseline"] = {k: test[k] for k in ("accuracy", "macro_f1")} if test else None
    majority = (info or {}).get("majority")
    out["majority"] = {k: majority[k] for k in ("accuracy", "macro_f1")} if majority else None
    reg = ((model.metadata if model else {}) or {}).get("mlflow") or {}
    out["registered_model"] = (f"{reg['registered_model_name']} v{reg['registered_model_version']}"
                               if reg.get("registered_model_version") is not None else None)
    out["champion"], out["gate_decision"] = None, None
    if reg.get("registered_model_version") is not None and tracking_uri:
        try:
            from mlflow import MlflowClient
            from mlflow.exceptions import MlflowException

            client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
            name, mine = reg["registered_model_name"], str(reg["registered_model_version"])
            out["gate_decision"] = (client.get_model_version(name, mine).tags or {}).get("gate.decision")
            try:
                holder = str(client.get_model_version_by_alias(name, "champion").version)
            except MlflowException:
                holder = None
            out["champion"] = holder == mine
            out["champion_version"] = holder
        except Exception as err:  # noqa: BLE001 - the summary reports what it could not read
            out["gate_decision"] = f"(MLflow not readable: {err})"
    return out


def format_summary(s: dict) -> str:
    def cells(m):
        return f"{m['accuracy']:>9.4f}  {m['macro_f1']:>9.4f}" if m else f"{'-':>9}  {'-':>9}"

    splits = s.get("splits") or {}
    lines = [f"dataset version {s['version']}: {s['rows'] if s['rows'] is not None else '?'} reviews "
             f"({s['rejected'] or 0} rejected)" + (f"; train {splits.get('train')} / validation "
                                                   f"{splits.get('validation')} / test {splits.get('test')}"
                                                   if splits else ""),
             f"{'on the test split':<22}{'accuracy':>9}  {'macro-F1':>9}",
             f"{'fine-tuned model':<22}{cells(s['finetuned'])}",
             f"{'baseline (TF-IDF+LR)':<22}{cells(s['baseline'])}",
             f"{'majority class':<22}{cells(s['majority'])}"]
    if s["champion"] is True:
        lines.append(f"champion: yes, {s['registered_model']} holds @champion")
    elif s["champion"] is False:
        holder = f"@champion is on v{s['champion_version']}" if s.get("champion_version") else "no model holds @champion"
        lines.append(f"champion: no, {holder} ({s['gate_decision'] or 'the quality gate has not decided yet'})")
    else:
        lines.append(f"champion: unknown ({s['gate_decision'] or 'no registered model or MLflow store'})")
    return "\n".join(lines)


def cmd_summary(args) -> int:
    from finetune_assets.dataset_versions.partitions import validate_version_key

    version = validate_version_key(args.version)
    storage = _storage(args)
    if storage.current("raw_reviews", version) is None:
        raise CliError(f"dataset version {version!r} has no materialized raw_reviews under {storage.root}")
    try:
        uri = _tracking_uri(args)
    except CliError:
        uri = None
    summary = version_summary(storage, version, uri)
    if args.json:
        _print_json(summary)
    else:
        print(format_summary(summary))
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
    add.add_argument("--source", required=True, help="file/folder/fsspec URL, hf:owner/name, or builtin:NAME (rotten_tomatoes, imdb, sample)")
    add.add_argument("--revision")
    add.add_argument("--text-column")
    add.add_argument("--label-column")
    add.add_argument("--encoding", default="utf-8")
    add.add_argument("--replace", action="store_true",
                     help="point an already registered key at a different source (only if nothing is materialized)")
    add.add_argument("--labels", help="class names in id order, e.g. Negative,Positive (default: inferred "
                                      "from the label values; see README 'Labels')")
    add.add_argument("--label-mapping", help="raw label -> class, e.g. 0=Negative,1=Positive; "
                                             "stars-to-sentiment maps 1-5 stars to Negative,Neutral,Positive")
    add.set_defaults(func=cmd_versions_add)
    rm = vsub.add_parser("remove", help="unregister a dataset version (its published files are kept)")
    rm.add_argument("key")
    rm.add_argument("--force", action="store_true", help="remove even though assets of it are materialized")
    rm.set_defaults(func=cmd_versions_remove)
    ls = vsub.add_parser("list", help="registered versions and their sources")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=cmd_versions_list)
    st = vsub.add_parser("status", help="per version and asset: materialized / stale / missing, when, data version")
    st.add_argument("versions", nargs="*", help="versions to show (default: all registered)")
    st.add_argument("--json", action="store_true", help="one JSON object per line")
    st.set_defaults(func=cmd_versions_status)

    pr = sub.add_parser(
        "predict", help="classify text with a trained model",
        description="Classify text: prints label, score and text per input (JSON lines when piped, tab "
                    "separated on a terminal).",
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
    inp.add_argument("--file", help="CSV/TSV/JSONL/JSON array/Parquet (optionally .gz/.bz2/.xz/.zst; column "
                                    "--text-column, default text/review/content/sentence), or TXT (one per line)")
    inp.add_argument("--text-column", help="column or JSON key holding the text (default: text)")
    inp.add_argument("--encoding", default="utf-8", help="encoding of --file (e.g. cp1256)")
    pr.add_argument("--batch-size", type=int, default=32)
    pr.add_argument("--max-length", type=int, default=512, help="truncate inputs to this many tokens")
    pr.add_argument("--json", action="store_true", help="JSON lines with text, label, score and all scores "
                                                        "(same as --format jsonl)")
    pr.add_argument("--format", choices=("auto", "jsonl", "tsv"), default="auto",
                    help="auto (default): tsv on a terminal, jsonl when piped or redirected; tsv escapes "
                         "tab/newline/backslash in the text; rows that cannot be classified are errors "
                         "(exit status 1)")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar for --file")
    pr.add_argument("--baseline", action="store_true", help="with --version: use baseline_model[v] (TF-IDF + LR)")
    pr.set_defaults(func=cmd_predict)

    ev = sub.add_parser(
        "evaluate", help="score a model on a labelled file: accuracy, macro-F1, per-class F1, confusion matrix",
        epilog="examples:\n"
               "  finetune-assets evaluate --version sample --file labelled.csv\n"
               "  finetune-assets evaluate --version sample --baseline --file labelled.csv --json\n"
               "  finetune-assets evaluate --model-uri models:/review-classifier@champion --file test.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    esrc = ev.add_argument_group("model (choose one)")
    esrc.add_argument("--version", help="the finetuned_model (or with --baseline the baseline_model) of a version")
    esrc.add_argument("--model-uri", help="MLflow model URI: models:/name@alias, models:/name/3, runs:/ID/model")
    esrc.add_argument("--model", help="a local Hugging Face model folder")
    esrc.add_argument("--baseline", action="store_true", help="with --version: score baseline_model[v]")
    esrc.add_argument("--tracking-uri", help="MLflow tracking URI (default as for predict)")
    ev.add_argument("--file", required=True, help="labelled CSV/TSV/JSONL/Parquet file (or folder)")
    ev.add_argument("--text-column", help="default: text/review/content/sentence")
    ev.add_argument("--label-column", help="default: label/polarity/sentiment/rating_class")
    ev.add_argument("--label-mapping", help="raw label -> model class: JSON object or RAW=Class,RAW=Class")
    ev.add_argument("--encoding", default="utf-8")
    ev.add_argument("--batch-size", type=int, default=32)
    ev.add_argument("--max-length", type=int, default=512)
    ev.add_argument("--json", action="store_true", help="one JSON object")
    ev.set_defaults(func=cmd_evaluate)

    bench = sub.add_parser("benchmarks", help="labelled sets that never train; every new model is scored on them")
    bsub = bench.add_subparsers(dest="benchmarks_command", required=True)
    badd = bsub.add_parser("add", help="register (freeze) a labelled file as a benchmark set")
    badd.add_argument("name", help="set name (1-63 of [A-Za-z0-9._-])")
    badd.add_argument("--source", required=True, help="labelled file or folder (CSV/TSV/JSONL/Parquet, fsspec URL)")
    badd.add_argument("--label-mapping", help="raw label -> class: JSON object or RAW=Class,RAW=Class")
    badd.add_argument("--text-column")
    badd.add_argument("--label-column")
    badd.add_argument("--encoding", default="utf-8")
    badd.set_defaults(func=cmd_benchmarks_add)
    bls = bsub.add_parser("list", help="registered benchmark sets")
    bls.add_argument("--json", action="store_true")
    bls.set_defaults(func=cmd_benchmarks_list)

    sm = sub.add_parser("summary", help="a version's rows, test scores (fine-tuned, baseline, majority), champion")
    sm.add_argument("version")
    sm.add_argument("--tracking-uri", help="MLflow tracking URI (default as for predict)")
    sm.add_argument("--json", action="store_true")
    sm.set_defaults(func=cmd_summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CliError, ValueError, OSError) as err:  # input or environment mistakes: one line, no traceback
        if isinstance(err, BrokenPipeError):  # `... | head`
            return 0
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
