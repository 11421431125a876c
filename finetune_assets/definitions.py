"""The code location: collects assets, checks, sensors, jobs and resources into ``defs``.

Nothing is read from the environment at import: ``defs`` is loaded by Dagster's tools
(``@dg.definitions``) when the code location starts, and tests build their own with
``build_defs(root, launcher)``. ``defs/tuning/definitions.py`` is the same code location tuning
every
new version first.
"""

from __future__ import annotations

import os

import dagster as dg

from finetune_assets.core.io.storage import STORAGE_ROOT_ENV
from finetune_assets.defs.automation import with_automation
from finetune_assets.defs.benchmarks.scores import benchmark_scores
from finetune_assets.defs.data.checks import asset_checks
from finetune_assets.defs.data.mds_shards import mds_shards
from finetune_assets.defs.data.pretrained import pretrained_model
from finetune_assets.defs.data.raw import raw_reviews
from finetune_assets.defs.data.tokenized import tokenized_reviews
from finetune_assets.defs.data.vocab_check import vocabulary_fit
from finetune_assets.defs.jobs import jobs
from finetune_assets.defs.models.baseline_model import baseline_model
from finetune_assets.defs.models.finetuned import finetuned_model
from finetune_assets.defs.promotion import champion, champion_model, quality_gate
from finetune_assets.defs.resources.launchers import TrainingLauncher, launcher_from_env
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.staleness import with_config_versions
from finetune_assets.defs.tuning.study_asset import tuning_study
from finetune_assets.defs.versions.landing import LandingZoneResource
from finetune_assets.defs.versions.sensors import build_sensors


def build_defs(
    storage_root: str | None = None,
    launcher: TrainingLauncher | None = None,
    tune_new_versions: bool = False,
) -> dg.Definitions:
    """Definitions over one storage root and one training launcher; new versions built by
    automation (``defs/automation.py``), tuned first where ``tune_new_versions``.

    Defaults (``storage_root`` / ``launcher`` None): the root from ``$FINETUNE_ASSETS_ROOT`` as a
    Dagster ``EnvVar`` (read by each run; ``./.finetune_assets`` where the location loads without
    it) and the launcher named by ``$FINETUNE_ASSETS_LAUNCHER`` (``local``, the default, or
    ``k8s``), read here, when the location loads.
    """
    return dg.Definitions(
        assets=with_automation(
            [
                *with_config_versions(
                    [
                        raw_reviews,
                        pretrained_model,
                        tokenized_reviews,
                        mds_shards,
                        finetuned_model,
                        champion_model,
                        baseline_model,
                        benchmark_scores,
                        tuning_study,
                    ]
                ),
                champion,  # reported by champion_model: nothing to configure
            ],
            tune_new_versions,
        ),
        asset_checks=[*asset_checks, quality_gate, vocabulary_fit],
        jobs=jobs,
        sensors=build_sensors(tune_new_versions),
        resources={
            "storage": _storage(storage_root),
            "launcher": launcher or launcher_from_env(),
            "mlflow": MlflowResource(),
            "landing": LandingZoneResource(),
        },
    )


def _storage(root: str | None) -> StorageResource:
    if root is not None:
        return StorageResource(root=root)
    if os.environ.get(STORAGE_ROOT_ENV):
        return StorageResource(root=dg.EnvVar(STORAGE_ROOT_ENV))
    return StorageResource()


@dg.definitions
def defs() -> dg.Definitions:
    """What ``dagster dev``, the code server and ``dagster asset materialize`` load."""
    return build_defs()
