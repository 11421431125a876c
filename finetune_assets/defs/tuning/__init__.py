"""Tuning: ``tuning_study``, an Optuna study over the trainer's hyper-parameters
(:mod:`.study_asset`), and ``tune_job`` to run one by hand (:mod:`.tune_job`); a deployment that
tunes every new version also runs ``sensors`` (:mod:`.on_landing`), loaded by
``finetune_assets.defs.tuning.definitions``.
"""

from finetune_assets.defs.tuning.on_landing import tuned_retrain_sensor, tuning_automation
from finetune_assets.defs.tuning.study_asset import tuning_study
from finetune_assets.defs.tuning.tune_job import tune_job

__all__ = ["assets", "jobs", "sensors"]

assets = [tuning_study]
jobs = [tune_job]
# only where new versions are tuned (build_defs(tune_new_versions=True))
sensors = [tuning_automation, tuned_retrain_sensor]
