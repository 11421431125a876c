"""What every check here shares: one verdict per dataset version."""

import dagster as dg

from finetune_assets.defs.versions.partitions import dataset_versions


def per_version_spec(
    name: str, asset: str, description: str, blocking: bool, reads=()
) -> dg.AssetCheckSpec:
    """A per-version check; ``reads``: other assets it reads (lineage + ordering inside a run)."""
    return dg.AssetCheckSpec(
        name,
        asset=asset,
        description=description,
        blocking=blocking,
        partitions_def=dataset_versions,
        additional_deps=list(reads),
    )


def version_of(context) -> str:
    """The dataset version a check runs for (its partition key), validated."""
    from finetune_assets.defs.versions.partitions import validate_version_key

    return validate_version_key(context.partition_key)
