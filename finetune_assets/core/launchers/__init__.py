"""Where training runs: the same torchrun command, as a local subprocess or as Kubernetes pods."""

from finetune_assets.core.launchers.base import TrainingFailed, TrainingLauncher, TrainingSpec

__all__ = ["TrainingFailed", "TrainingSpec", "TrainingLauncher"]
