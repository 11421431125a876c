"""Dataset versions: the dynamic partitions every data asset is keyed by."""

from __future__ import annotations

import warnings

import dagster as dg

from finetune_assets.core.versions.keys import InvalidVersionKey, validate_version_key

__all__ = ["DATASET_VERSIONS", "InvalidVersionKey", "dataset_versions", "validate_version_key"]

DATASET_VERSIONS = "dataset_versions"

dataset_versions = dg.DynamicPartitionsDefinition(name=DATASET_VERSIONS)

# Every check is per version (one verdict per dataset version), so every check spec carries this
# partitions_def, and Dagster 1.13 warns that partitioned check specs are in preview once per spec
# site and process: two dozen identical lines per run. Known and accepted here; only that message,
# from the two places that raise it, is silenced. Other preview/beta warnings still show.
for _module in (
    r"finetune_assets\.checks",
    r"dagster\._core\.definitions\.decorators\.asset_check_decorator",
):
    warnings.filterwarnings(
        "ignore",
        message=r"Specifying a partitions_def on an AssetCheckSpec is currently in preview",
        category=dg.PreviewWarning,
        module=_module,
    )
