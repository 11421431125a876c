"""The study's storage and pruner, opened the same way by the tuning asset and by the trainer.

Kept apart from the trainer's Lightning callback (``pruning.py``) so that loading the code
location, which builds studies, never imports torch or Lightning.
"""

from __future__ import annotations

import os
from typing import Any

from finetune_assets.core.training.config import PrunerConfig

PRUNED_AT_STEP = "pruned_at_step"  # trial user attribute: the trainer stopped the trial there
ENV_PREFIX = "env:"  # a storage given as env:NAME: the URL is in that environment variable
STORAGE_ENV = "FINETUNE_ASSETS_STUDY_STORAGE"  # where the asset hands a database URL to trials
HEARTBEAT_SECONDS = 60  # RDB storage: a RUNNING trial silent for 2x this is stale (failed, retried)
_RDB_SCHEMES = ("sqlite", "postgresql", "mysql", "oracle", "mssql")


def resolve(url: str) -> str:
    """``env:NAME`` -> the URL in environment variable NAME (a password stays out of files)."""
    if not url.startswith(ENV_PREFIX):
        return url
    name = url.removeprefix(ENV_PREFIX)
    value = os.environ.get(name)
    if not value:
        raise ValueError(f"study storage {url!r}: environment variable {name} is not set")
    return value


def open_storage(url: str, heartbeat: bool = False) -> Any:
    """An Optuna storage from one string both the asset and the trainer understand.

    ``heartbeat`` (the asset's side, RDB only): RUNNING trials beat every ``HEARTBEAT_SECONDS``;
    one whose run died is failed by the next trial's start and enqueued again once (Optuna's
    ``RetryHeartbeatStaleTrialCallback``). A journal has no heartbeat (core/tuning/study.py
    ``recover``).

    An SQLAlchemy URL (``postgresql+psycopg://...``, ``sqlite:///...``) opens an ``RDBStorage``;
    anything else is a journal file path (``JournalFileBackend``: file locks, safe for several
    processes on one file system), the local default under the storage root.
    """
    # lazy, as optuna in make_pruner: the trainer imports this module (tuning.pruning) for every
    # run, and only a tuning trial opens a study
    import optuna
    from optuna.storages.journal import JournalFileBackend

    url = resolve(url)
    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else ""
    if scheme in _RDB_SCHEMES:
        if not heartbeat:
            return optuna.storages.RDBStorage(url)
        return optuna.storages.RDBStorage(
            url,
            heartbeat_interval=HEARTBEAT_SECONDS,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                max_retry=1
            ),
        )
    if scheme and scheme != "file":
        raise ValueError(
            f"study storage {url!r}: expected a database URL ({', '.join(_RDB_SCHEMES)}) "
            "or a journal file path"
        )
    return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("file://")))


def make_pruner(config: PrunerConfig) -> Any:
    """The study's pruner, built the same way by the asset and by the trainer that asks it."""
    import optuna  # lazy: see open_storage

    if config.kind == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(
        n_startup_trials=config.startup_trials, n_warmup_steps=config.warmup_steps
    )
