"""What every command group shares: the storage root, the Dagster instance, MLflow, output."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# Project and third-party modules are imported inside the functions that use them, never
# here: `--help`, and `predict` on a local folder, load neither Dagster nor MLflow
# (cli/__init__.py).

# == finetune_assets.core.io.storage.STORAGE_ROOT_ENV, not imported (storage pulls in fsspec)
ROOT_ENV = "FINETUNE_ASSETS_ROOT"


class CliError(Exception):
    """A problem the user can fix; printed as ``error: ...`` with exit status 2."""


def root_of(args) -> str:
    from finetune_assets.core.io.storage import default_root

    return args.root or default_root()


def open_storage(args, write: bool = False):
    from finetune_assets.core.io.storage import Storage

    root = root_of(args)
    if "://" not in root and (write or Path(root).expanduser().is_file()):
        check_writable_dir(
            Path(root).expanduser(), f"storage root {root}", f"--root or ${ROOT_ENV}"
        )
    return Storage(root)


def command_group(sub, name: str, help: str):
    """A command group (``finetune-assets NAME COMMAND``): the parsers its commands are added to."""
    group = sub.add_parser(name, help=help)
    return group.add_subparsers(dest=f"{name}_command", required=True)


def check_writable_dir(path: Path, what: str, fix: str) -> None:
    """A folder we will write into: not a file, and (it or its nearest existing parent) writable."""
    if path.exists() and not path.is_dir():
        raise CliError(f"{what} is a file, not a folder: point {fix} at a folder")
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise CliError(
            f"{what}: {probe} is a file, so the folder cannot be created; point {fix} at a folder"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise CliError(
            f"{what}: {probe} is not writable by this user; point {fix} at a writable folder"
        )
    try:  # os.access says yes to root under /proc, /sys and read-only mounts: create it to be sure
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CliError(
            f"{what}: cannot create {path}: {err.strerror or err}; point {fix} at a writable folder"
        ) from err


def open_instance():
    import dagster as dg

    if not os.environ.get("DAGSTER_HOME"):
        raise CliError(
            "DAGSTER_HOME is not set: dataset versions live in the Dagster instance; "
            "export DAGSTER_HOME=$PWD/.dagster_home first (the same one `dagster dev` uses)"
        )
    home = Path(os.environ["DAGSTER_HOME"])
    if not home.is_absolute():
        raise CliError(
            f"DAGSTER_HOME={home} is relative; Dagster needs an absolute path: "
            f"export DAGSTER_HOME={Path(home).resolve()}"
        )
    check_writable_dir(home, f"DAGSTER_HOME {home}", "DAGSTER_HOME")
    home.mkdir(parents=True, exist_ok=True)
    # a fresh home: an empty dagster.yaml means defaults, without Dagster's warning
    if not any(home.iterdir()):
        (home / "dagster.yaml").write_text("")
    return dg.DagsterInstance.get()


def tracking_uri_of(args) -> str:
    """The rule of ``finetune_assets.core.io.tracking``, its embedded store under the storage root
    (as
    MlflowResource).
    """
    from finetune_assets.core.io.tracking import tracking_uri

    root = root_of(args)
    try:
        return tracking_uri(
            args.tracking_uri,
            f"{root.rstrip('/')}/mlflow",
            "pass --tracking-uri (or set MLFLOW_TRACKING_URI)",
        )
    except ValueError as err:
        raise CliError(str(err)) from None


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def print_json(obj) -> None:
    if isinstance(obj, list):
        for item in obj:
            print(json.dumps(item, ensure_ascii=False))
    else:
        print(json.dumps(obj, ensure_ascii=False))


def parse_label_mapping(text: str | None) -> dict[str, str] | None:
    """``--label-mapping '{"pos": "Positive"}'`` or ``pos=Positive,neg=Negative``."""
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
        raise CliError(
            "--label-mapping takes RAW=Class pairs separated by commas, or a JSON object"
        )
    return {k.strip(): v.strip() for k, v in pairs}
