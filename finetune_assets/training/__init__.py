"""The trainer that torchrun runs in every worker (local subprocess or Kubernetes pod). No Dagster here."""

from finetune_assets.training.config import ConfigError, DataConfig, HyperParameters, MlflowConfig, TrainerConfig

__all__ = ["ConfigError", "DataConfig", "HyperParameters", "MlflowConfig", "TrainerConfig"]
