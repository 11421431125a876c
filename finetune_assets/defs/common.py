"""What every feature shares: per-version assets and checks (one materialization, one verdict per
dataset version), the owners, tables, and the labels of what a step launches.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import dagster as dg

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.defs.versions.partitions import dataset_versions, validate_version_key

OWNERS = ["team:ml-platform"]


@contextlib.contextmanager
def _parameters_we_rely_on() -> Iterator[None]:
    """Dagster 1.13 calls two parameters this code location needs preview / beta, and warns once
    per call site and process (two dozen identical lines per run): ``partitions_def`` on a check
    (every check is per version) and ``backfill_policy`` on an asset (the training run's own,
    ``models/finetuned.py``). Known and accepted: only those two messages, only around the Dagster
    calls below that pass them; other preview / beta warnings still show.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"Specifying a partitions_def on an AssetCheckSpec is currently in preview",
            category=dg.PreviewWarning,
        )
        warnings.filterwarnings(
            "ignore",
            message=r"Parameter `backfill_policy` of function `asset`",
            category=dg.BetaWarning,
        )
        yield


def version_asset(
    group_name: str, kinds: set[str], **kwargs
) -> Callable[[Callable], dg.AssetsDefinition]:
    """``dg.asset`` for an asset materialized once per dataset version, owned by ``OWNERS``."""

    def decorate(fn: Callable) -> dg.AssetsDefinition:
        with _parameters_we_rely_on():
            return dg.asset(
                partitions_def=dataset_versions,
                group_name=group_name,
                kinds=kinds,
                owners=OWNERS,
                **kwargs,
            )(fn)

    return decorate


def version_check(**kwargs) -> Callable[[Callable], dg.AssetChecksDefinition]:
    """``dg.asset_check`` for a check with one verdict per dataset version."""

    def decorate(fn: Callable) -> dg.AssetChecksDefinition:
        with _parameters_we_rely_on():
            return dg.asset_check(partitions_def=dataset_versions, **kwargs)(fn)

    return decorate


def version_check_spec(
    name: str, asset: str, description: str, blocking: bool, reads=()
) -> dg.AssetCheckSpec:
    """A per-version check of a multi-check; ``reads``: other assets it reads (lineage + ordering
    inside a run).
    """
    with _parameters_we_rely_on():
        return dg.AssetCheckSpec(
            name,
            asset=asset,
            description=description,
            blocking=blocking,
            partitions_def=dataset_versions,
            additional_deps=list(reads),
        )


def version_of(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> str:
    """The dataset version (partition key) a step runs for, checked against the key rule."""
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
