"""The code location: the features' assets, checks, jobs and sensors, with the shared resources.

Each feature folder under ``defs/`` says what it contributes in its ``__init__`` (``assets``,
``asset_checks``, ``jobs``, ``sensors``); ``build_defs`` merges them into one ``Definitions`` and
applies, once and at the root, what spans features: config defaults folded into code versions
(``defs/staleness.py``) and the automation conditions (``defs/automation.py``).

Not ``dg.load_from_defs_folder``: it would collect every Definitions-like object at module scope
under ``defs/`` (a sensor imported into another module, the tuning code location's own
``@dg.definitions``), leave no place for the root transforms above, and have no say in what
``tune_new_versions`` or the resources change. ``[tool.dg]`` points ``dg`` at this module instead.

Nothing is read from the environment at import: ``defs`` is loaded by Dagster's tools
(``@dg.definitions``) when the code location starts, and tests build their own with
``build_defs(root, launcher)``. ``defs/tuning/definitions.py`` is the same code location tuning
every new version.
"""

from __future__ import annotations

import os

import dagster as dg

from finetune_assets.core.io.storage import STORAGE_ROOT_ENV
from finetune_assets.defs import benchmarks, data, models, promotion, tuning, versions
from finetune_assets.defs.automation import version_automation, with_automation
from finetune_assets.defs.jobs import jobs
from finetune_assets.defs.resources.launchers import TrainingLauncher, launcher_from_env
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.staleness import with_config_versions
from finetune_assets.defs.versions.landing import LandingZoneResource


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
    assets = [*data.assets, *models.assets, *promotion.assets, *benchmarks.assets, *tuning.assets]
    return dg.Definitions(
        assets=with_automation(with_config_versions(assets), tune_new_versions),
        asset_checks=[*data.asset_checks, *promotion.asset_checks],
        jobs=[*jobs, *tuning.jobs],
        sensors=[
            *versions.sensors,
            *(tuning.sensors if tune_new_versions else ()),
            version_automation(tune_new_versions),
        ],
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
