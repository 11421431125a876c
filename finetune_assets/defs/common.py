"""Small pieces every asset module shares."""

from __future__ import annotations

import dagster as dg

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.defs.versions.partitions import validate_version_key

OWNERS = ["team:ml-platform"]


def version_of(context: dg.AssetExecutionContext) -> str:
    """The dataset version (partition key) of this materialization, checked against the key rule."""
    return validate_version_key(context.partition_key)


def markdown_table(header: tuple[str, ...], rows: list[tuple]) -> dg.MetadataValue:
    return dg.MetadataValue.md(viz.markdown_table(header, rows))


def launch_labels(context: dg.AssetExecutionContext, asset: str, version: str) -> dict[str, str]:
    """Labels of the pods/Jobs a step starts: a retried run finds (and replaces) what a dead one
    left.
    """
    return {
        "dagster/run-id": context.run.run_id,
        "dagster/asset": asset,
        "dagster/partition": version,
    }
