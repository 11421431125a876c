"""Dataset versions: the dynamic partitions every data asset is keyed by."""

from __future__ import annotations

import dagster as dg

from finetune_assets.core.versions.keys import InvalidVersionKey, validate_version_key

__all__ = ["DATASET_VERSIONS", "InvalidVersionKey", "dataset_versions", "validate_version_key"]

DATASET_VERSIONS = "dataset_versions"

dataset_versions = dg.DynamicPartitionsDefinition(name=DATASET_VERSIONS)
