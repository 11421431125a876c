"""The trainer's known, harmless library notices, silenced where they arise (everything else shows).

Called once at the start of every training run (``run.train``), never at import: importing the
trainer changes no warning filter of the process that imports it.
"""

from __future__ import annotations

import logging
import warnings


class _DropLitLoggerTip(logging.Filter):
    """Lightning advertises its cloud logger on every Trainer; this run logs to MLflow."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "try installing [litlogger]" not in record.getMessage()


def quiet_known_notices() -> None:
    """Silence the trainer's known, harmless library notices where they arise; all else stays.

    Each filter names the message, the category and the module that warns (not a blanket ignore).
    """
    # Lightning 2.6's own pytree helper uses the LeafSpec class torch deprecated (not our code).
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"pytorch_lightning\.utilities\._pytree",
    )
    # StreamingDataset partitions samples per rank and worker itself: its __len__ is exact per rank.
    warnings.filterwarnings(
        "ignore",
        message=r"Your `IterableDataset` has `__len__` defined",
        category=UserWarning,
        module=r"pytorch_lightning\.utilities\.data",
    )
    # A resumed run's best-checkpoint folder (core/training/checkpoints/best.py) holds the best so
    # far, by design.
    warnings.filterwarnings(
        "ignore",
        message=r"Checkpoint directory .*[/\\]best exists and is not empty",
        category=UserWarning,
        module=r"pytorch_lightning\.callbacks\.model_checkpoint",
    )
    tips = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    if not any(isinstance(f, _DropLitLoggerTip) for f in tips.filters):
        tips.addFilter(_DropLitLoggerTip())
