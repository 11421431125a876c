"""The code location: collects assets, checks, sensors, jobs and resources into ``defs``."""

from __future__ import annotations

import dagster as dg

from finetune_assets.assets.baseline import baseline_model
from finetune_assets.assets.benchmarks import benchmark_scores
from finetune_assets.assets.champion import champion, champion_model
from finetune_assets.assets.finetuned import finetuned_model
from finetune_assets.assets.pretrained import pretrained_model
from finetune_assets.assets.raw import raw_reviews
from finetune_assets.assets.shards import mds_shards
from finetune_assets.assets.tokenized import tokenized_reviews
from finetune_assets.assets.tuning import tuning_study
from finetune_assets.checks import asset_checks
from finetune_assets.jobs import jobs
from finetune_assets.launchers import TrainingLauncher
from finetune_assets.launchers.select import launcher_from_env
from finetune_assets.resources.landing import LandingZoneResource
from finetune_assets.resources.mlflow import MlflowResource
from finetune_assets.resources.storage_root import StorageResource
from finetune_assets.sensors import sensors
from finetune_assets.staleness import with_config_versions
from finetune_assets.storage import default_root
from finetune_assets.vocab_check import vocabulary_fit


def build_defs(
    storage_root: str | None = None, launcher: TrainingLauncher | None = None
) -> dg.Definitions:
    """Definitions over one storage root and one training launcher.

    Defaults: ``$FINETUNE_ASSETS_ROOT`` (or ``./.finetune_assets``) and the launcher named by
    ``$FINETUNE_ASSETS_LAUNCHER`` (``local``, the default, or ``k8s``).
    """
    return dg.Definitions(
        assets=[
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
        asset_checks=[*asset_checks, vocabulary_fit],
        jobs=jobs,
        sensors=sensors,
        resources={
            "storage": StorageResource(root=storage_root or default_root()),
            "launcher": launcher or launcher_from_env(),
            "mlflow": MlflowResource(),
            "landing": LandingZoneResource(),
        },
    )


defs = build_defs()
