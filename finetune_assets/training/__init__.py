"""The trainer that torchrun runs in every worker (local subprocess or Kubernetes pod). No Dagster here."""

from finetune_assets.training.config import ConfigError, DataConfig, MlflowConfig, OptimConfig, TrainerConfig

__all__ = ["ConfigError", "DataConfig", "MlflowConfig", "OptimConfig", "TrainerConfig"]
