"""The one module that touches Dagster's private API (``dagster._...``): what the code location
needs and Dagster 1.13 offers no public form for. Each name is re-exported with why it is needed;
the tests in ``finetune_assets_tests/defs/test_dagster_internals.py`` exercise each against a real
instance, so an upgrade that moves or changes one fails there, not in a run.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

# Data-version tags of an asset event. An asset event may carry its own input data version / event
# pointer tags and Dagster keeps them over the step's (``_get_output_asset_events``): the way a
# re-executed step says which upstream version it really read (defs/provenance.py). No public
# constant or helper names these tags.
from dagster._core.definitions.data_version import (
    DATA_VERSION_TAG,
    NULL_EVENT_POINTER,
    CachingStaleStatusResolver,
    StaleStatus,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)

# Per-partition check lookups: ``instance.get_latest_asset_check_evaluation_record`` is
# unpartitioned; the event log storage filters by partition only with this filter.
from dagster._core.event_api import PartitionKeyFilter

# The UI's own staleness (``CachingStaleStatusResolver`` needs a loading context; the webserver's
# is per request): ``finetune-assets versions`` reports what the UI shows.
from dagster._core.loader import LoadingContext
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

# The run-retry daemon's mark on a failed run it will re-launch (``dagster/will_retry``): a failed
# run so marked is not final. Public only as the tag's string.
from dagster._core.storage.tags import WILL_RETRY_TAG

__all__ = [
    "DATA_VERSION_TAG",
    "NULL_EVENT_POINTER",
    "WILL_RETRY_TAG",
    "StaleStatus",
    "failed_check_evaluations",
    "get_input_data_version_tag",
    "get_input_event_pointer_tag",
    "stale_status_resolver",
]


def failed_check_evaluations(
    instance: dg.DagsterInstance, check_keys: Sequence[dg.AssetCheckKey], partition: str | None
) -> dict[dg.AssetCheckKey, dg.AssetCheckEvaluation]:
    """The checks among ``check_keys`` whose latest evaluation for ``partition`` failed (a check
    only planned, or never run, is not here), with that evaluation.
    """
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        list(check_keys), partition_filter=PartitionKeyFilter(key=partition)
    )
    failed = {}
    for key, record in latest.items():
        if record.status == AssetCheckExecutionRecordStatus.FAILED and record.evaluation:
            failed[key] = record.evaluation
    return failed


class _LoadingContext(LoadingContext):
    """A cache holder for one resolver (the webserver keeps one per request)."""

    def __init__(self, instance: dg.DagsterInstance):
        self._instance, self._loaders = instance, {}

    @property
    def instance(self) -> dg.DagsterInstance:
        return self._instance

    @property
    def loaders(self) -> dict:
        return self._loaders


def stale_status_resolver(instance: dg.DagsterInstance, asset_graph) -> CachingStaleStatusResolver:
    """Dagster's stale status over ``asset_graph`` (``Definitions.resolve_asset_graph()``)."""
    return CachingStaleStatusResolver(instance, asset_graph, _LoadingContext(instance))
