"""The MLflow tracking-URI rule, in one place for the Dagster resource, the trainer and the CLI (no
Dagster).

An explicit URI wins, then ``$MLFLOW_TRACKING_URI``, else an embedded SQLite store in a local folder
(the storage root's ``mlflow/``; the trainer's output folder when it runs standalone), so the
default graph needs no tracking server.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from finetune_assets.core.io.primitives import file_lock

TRACKING_ENV = "MLFLOW_TRACKING_URI"
EMBEDDED_DB = "mlflow.db"


def configured_uri(explicit: str | None) -> str | None:
    """The URI a person set (argument, then environment), or None when the embedded store
    applies.
    """
    return explicit or os.environ.get(TRACKING_ENV) or None


def tracking_uri(explicit: str | None, embedded_dir: str, fix: str) -> str:
    """``explicit``, ``$MLFLOW_TRACKING_URI``, else SQLite in the local folder ``embedded_dir``.

    ``fix`` says which setting to give when ``embedded_dir`` is remote: an embedded
    store cannot live on an object store.
    """
    uri = configured_uri(explicit)
    if uri:
        return uri
    if "://" in embedded_dir:
        raise ValueError(
            f"{embedded_dir} is remote and no MLflow tracking URI is set "
            f"(an embedded SQLite store needs a local folder): {fix}"
        )
    return f"sqlite:///{Path(embedded_dir).expanduser().resolve()}/{EMBEDDED_DB}"


@functools.cache
def ensure_sqlite_store(uri: str) -> str:
    """Create a SQLite store (the embedded one, or one a person named) holding a file lock beside
    it; ``uri`` back, and any other URI as it is (a tracking server migrates itself).

    MLflow creates its tables (Alembic migrations) when a process first opens a store. Runs that
    open a fresh store at once (a sensor's or a backfill's data-preparation runs of several
    versions) race in those migrations ("Online migration expected to match one row") and fail.
    The first process migrates under the lock; later ones find the tables made. Once per process.
    """
    if not uri.startswith("sqlite:///"):
        return uri
    from mlflow import MlflowClient  # lazy: the code location imports this module

    db = Path(uri.removeprefix("sqlite:///"))
    with file_lock(db.with_name(f"{db.name}.lock")):
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    return uri


def safe_uri(uri: str | None) -> str | None:
    """A tracking URI without credentials (``https://user:token@host`` -> ``https://host``)."""
    if not uri or "@" not in uri:
        return uri
    parts = urlsplit(uri)
    return urlunsplit(
        parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))
    )


def web_ui(uri: str | None) -> str | None:
    """The MLflow UI base for links: an http(s) URI without credentials, else None."""
    if (
        uri
        and uri.startswith(("http://", "https://"))
        and "@" not in uri.split("//", 1)[1].split("/", 1)[0]
    ):
        return uri.rstrip("/")
    return None


def run_url(ui: str | None, experiment_id: str, run_id: str) -> str | None:
    return f"{ui}/#/experiments/{experiment_id}/runs/{run_id}" if ui else None
