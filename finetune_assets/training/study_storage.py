"""The study's storage and pruner, opened the same way by the tuning asset and by the trainer.

Kept apart from the trainer's Lightning callback (``pruning.py``) so that loading the code
location, which builds studies, never imports torch or Lightning.
"""

from __future__ import annotations

from typing import Any

from finetune_assets.training.config import PrunerConfig

PRUNED_AT_STEP = "pruned_at_step"  # trial user attribute: the trainer stopped the trial there
_RDB_SCHEMES = ("sqlite", "postgresql", "mysql", "oracle", "mssql")


def open_storage(url: str) -> Any:
    """An Optuna storage from one string both the asset and the trainer understand.

    An SQLAlchemy URL (``postgresql+psycopg://...``, ``sqlite:///...``) opens an ``RDBStorage``;
    anything else is a journal file path (``JournalFileBackend``: file locks, safe for several
    processes on one file system), the local default under the storage root.
    """
    import optuna
    from optuna.storages.journal import JournalFileBackend

    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else ""
    if scheme in _RDB_SCHEMES:
        return optuna.storages.RDBStorage(url)
    if scheme and scheme != "file":
        raise ValueError(
            f"study storage {url!r}: expected a database URL ({', '.join(_RDB_SCHEMES)}) "
            "or a journal file path"
        )
    return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("file://")))


def make_pruner(config: PrunerConfig) -> Any:
    """The study's pruner, built the same way by the asset and by the trainer that asks it."""
    import optuna

    if config.kind == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(
        n_startup_trials=config.startup_trials, n_warmup_steps=config.warmup_steps
    )
