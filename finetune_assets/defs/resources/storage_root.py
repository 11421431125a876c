"""The storage root every asset writes under, as a Dagster resource."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from finetune_assets.core.io.storage import DEFAULT_ROOT, Storage


class StorageResource(dg.ConfigurableResource):
    """A local folder (default) or any fsspec URL such as ``s3://bucket/prefix``."""

    root: str = Field(
        default=DEFAULT_ROOT,
        description="Storage root for every asset, checkpoint and the embedded MLflow store.",
    )

    def storage(self) -> Storage:
        return Storage(self.root)
