"""The code location: collects assets, checks, sensors and resources into ``defs``."""

from __future__ import annotations

import dagster as dg

from finetune_assets.assets.pretrained import pretrained_model
from finetune_assets.assets.raw import raw_reviews
from finetune_assets.assets.shards import mds_shards
from finetune_assets.assets.tokenized import tokenized_reviews
from finetune_assets.checks import asset_checks
from finetune_assets.jobs import jobs
from finetune_assets.resources.storage import StorageResource
from finetune_assets.sensors import sensors
from finetune_assets.storage import default_root

def build_defs(storage_root: str | None = None) -> dg.Definitions:
    """Definitions over one storage root (default: ``$FINETUNE_ASSETS_ROOT`` or ``./.finetune_assets``)."""
    root = storage_root or default_root()
    return dg.Definitions(
        assets=[raw_reviews, pretrained_model, tokenized_reviews, mds_shards],
        asset_checks=asset_checks,
        jobs=jobs,
        sensors=sensors,
        resources={"storage": StorageResource(root=root)},
    )


defs = build_defs()
