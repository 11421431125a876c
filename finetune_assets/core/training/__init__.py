"""The trainer that torchrun runs in every worker (local subprocess or Kubernetes pod). No
Dagster here.
"""

from finetune_assets.core.training.config import (
    ConfigError,
    DataConfig,
    MlflowConfig,
    TrainerConfig,
)
from finetune_assets.core.training.hyperparameters import HyperParameters

__all__ = [
    "PROGRESS",
    "ConfigError",
    "DataConfig",
    "HyperParameters",
    "MlflowConfig",
    "TrainerConfig",
]

# The first word of rank 0's progress lines (callbacks.Progress); launchers pick them out of the
# output.
PROGRESS = "progress:"
