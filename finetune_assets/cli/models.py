"""The model a command scores with: a version's model, an MLflow URI, or a folder (exactly one)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from finetune_assets.cli.common import CliError, root_of, tracking_uri_of

# Project and third-party modules are imported inside the functions that use them, never
# here: `--help`, and `predict` on a local folder, load neither Dagster nor MLflow
# (cli/__init__.py).


def _normalize_model_uri(uri: str) -> str:
    """``models:/name/champion`` -> ``models:/name@champion``; numeric versions and ``latest``
    stay.
    """
    if uri.startswith("models:/") and "@" not in uri:
        name, _, ref = uri[len("models:/") :].rpartition("/")
        if name and ref and not ref.isdigit() and ref != "latest":
            return f"models:/{name}@{ref}"
    return uri


def _from_folder(path: Path, source: str | None = None):
    """``inference.Classifier`` from a folder; a folder without a model is a user error."""
    from finetune_assets.core.evaluation.inference import Classifier, ModelFolderError

    try:
        return Classifier.from_folder(path, source)
    except ModelFolderError as err:
        raise CliError(str(err)) from err


def add_model_choice(parser, version_help: str, model_help: str):
    """The "model (choose one)" arguments ``load_classifier`` reads (--version, --model-uri,
    --model), as an argument group the command adds its own to.
    """
    group = parser.add_argument_group("model (choose one)")
    group.add_argument("--version", help=version_help)
    group.add_argument(
        "--model-uri", help="MLflow model URI: models:/name@alias, models:/name/3, runs:/ID/model"
    )
    group.add_argument("--model", help=model_help)
    return group


def load_classifier(args):
    """The model chosen by --version / --model-uri / --model (exactly one)."""
    chosen = [o for o in ("version", "model_uri", "model") if getattr(args, o)]
    if len(chosen) != 1:
        raise CliError(
            "choose the model with exactly one of --version V, --model-uri models:/name@alias, "
            "or --model PATH"
        )
    if getattr(args, "baseline", False):
        if not args.version:
            raise CliError(
                "--baseline scores the baseline_model of a dataset version: pass --version V"
            )
        return _baseline_for_version(args)
    if args.model:
        return _from_folder(Path(args.model).expanduser())
    if args.version:
        return _classifier_for_version(args)
    return _classifier_for_uri(args)


def _classifier_for_version(args):
    from finetune_assets.core.io.contracts import FINETUNED_MODEL, MODEL_SUBDIR
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.core.versions.keys import validate_version_key

    version = validate_version_key(args.version)
    storage = Storage(root_of(args))
    published = storage.current(FINETUNED_MODEL, version)
    if published is None:
        from finetune_assets.defs.versions.register import read_version

        hint = (
            "it is registered but finetuned_model has not been materialized; run "
            "`dagster asset materialize -m finetune_assets.definitions --select '*' --partition "
            f"{version}`"
            if read_version(storage, version) is not None
            else "it is not registered; see `finetune-assets versions list`"
        )
        raise CliError(
            f"no trained model for dataset version {version!r} under {storage.root}: {hint}"
        )
    if storage.is_local:
        return _from_folder(
            Path(published.url), source=f"finetuned_model[{version}] {published.url}"
        )
    tmp = tempfile.mkdtemp(prefix="finetune-assets-model-")
    storage.fs.get(f"{published.url}/{MODEL_SUBDIR}/", tmp + "/", recursive=True)
    return _from_folder(Path(tmp), source=f"finetuned_model[{version}] {published.url}")


def _baseline_for_version(args):
    """baseline_model[v]: TF-IDF + logistic regression, with the same ``predict`` as
    ``inference.Classifier``.
    """
    from finetune_assets.core.evaluation.baseline import BaselineModel
    from finetune_assets.core.io.contracts import BASELINE_MODEL
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.core.versions.keys import validate_version_key

    version = validate_version_key(args.version)
    storage = Storage(root_of(args))
    published = storage.current(BASELINE_MODEL, version)
    if published is None:
        raise CliError(
            f"no baseline_model for dataset version {version!r} under {storage.root}; "
            "materialize it "
            "with `dagster asset materialize -m finetune_assets.definitions --select "
            "baseline_model "
            f"--partition {version}`"
        )
    with storage.local_copy(published.url) as local:
        return BaselineModel.load(Path(local), source=f"baseline_model[{version}] {published.url}")


def _classifier_for_uri(args):
    import mlflow

    from finetune_assets.core.evaluation.inference import Classifier

    uri = _normalize_model_uri(args.model_uri)
    mlflow.set_tracking_uri(tracking_uri_of(args))
    mlflow.set_registry_uri(tracking_uri_of(args))
    try:
        components = mlflow.transformers.load_model(uri, return_type="components", device=-1)
    except mlflow.exceptions.MlflowException as err:
        raise CliError(f"cannot load {uri} from {tracking_uri_of(args)}: {err.message}") from err
    return Classifier(components["model"], components["tokenizer"], source=uri)
