"""Small pieces every asset module shares."""

from __future__ import annotations

import dagster as dg

from finetune_assets.partitions import validate_version_key

OWNERS = ["team:ml-platform"]


def version_of(context: dg.AssetExecutionContext) -> str:
    """The dataset version (partition key) of this materialization, checked against the key rule."""
    return validate_version_key(context.partition_key)


def markdown_table(header: tuple[str, ...], rows: list[tuple]) -> dg.MetadataValue:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return dg.MetadataValue.md("\n".join(lines))
