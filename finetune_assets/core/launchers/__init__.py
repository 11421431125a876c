"""Where training runs: the same torchrun command, as a local subprocess or as Kubernetes pods.

Dagster-free; the ``launcher`` resources over these are in ``defs/resources/launchers.py``.
"""

from finetune_assets.core.launchers.base import Log, RunContext, TrainingFailed, TrainingSpec

__all__ = ["Log", "RunContext", "TrainingFailed", "TrainingSpec"]
