"""The automation sensor's ticks without the daemon: Dagster's own evaluation of the definitions'
automation conditions (``dg.evaluate_automation_conditions``) over a real instance, the runs it
would request built by the daemon's own function, and what a run would leave reported as runless
events.
"""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.automation_tick_evaluation_context import build_run_requests

from finetune_assets.core.io.contracts import (
    BASELINE_MODEL,
    CHAMPION_MODEL,
    FINETUNED_MODEL,
    MDS_SHARDS,
    RAW_REVIEWS,
    TOKENIZED_REVIEWS,
)

BENCHMARK_SCORES = "benchmark_scores"
DATA = {RAW_REVIEWS, TOKENIZED_REVIEWS, MDS_SHARDS, BASELINE_MODEL}
TRAINING = {FINETUNED_MODEL, CHAMPION_MODEL, BENCHMARK_SCORES}
CHECKS = {
    RAW_REVIEWS: ("schema_and_labels", "min_rows_per_class", "rejected_share"),
    MDS_SHARDS: ("counts_match_tokenized", "no_empty_split", "splits_readable"),
    FINETUNED_MODEL: ("quality_gate",),
}


class Ticks:
    """The automation sensor's ticks over one instance, its cursor kept between them."""

    def __init__(self, instance: dg.DagsterInstance, defs: dg.Definitions):
        self.instance, self.defs, self.cursor = instance, defs, None
        self.graph = defs.resolve_asset_graph()

    def tick(self) -> set[tuple[str, str | None]]:
        result = dg.evaluate_automation_conditions(
            defs=self.defs, instance=self.instance, cursor=self.cursor
        )
        self.cursor, self.last = result.cursor, result
        requested = set()
        for key in self.graph.materializable_asset_keys:
            partitioned = self.graph.get(key).partitions_def is not None
            for pk in result.get_requested_partitions(key) if partitioned else ():
                requested.add((key.to_user_string(), pk))
            if not partitioned and result.get_num_requested(key):
                requested.add((key.to_user_string(), None))
        return requested

    def explain(self, asset: str) -> str:
        """The last tick's evaluation of ``asset``'s condition, operand by operand (for a failing
        assertion's message).
        """
        lines = []

        def walk(result, depth: int) -> None:
            label = result.condition.get_label() or type(result.condition).__name__
            value = result.true_subset.get_internal_value()
            lines.append(f"{'  ' * depth}{label}: {str(value)[:80]}")
            for child in result.child_results:
                walk(child, depth + 1)

        for result in self.last.results:
            if result.key == dg.AssetKey(asset):
                walk(result, 0)
        return "\n".join(lines)

    def run_requests(self) -> list[dg.RunRequest]:
        """The runs the daemon makes of the last tick's requests (version_automation's settings:
        no backfills, the retry tags).
        """
        from finetune_assets.defs.jobs import RETRY_TAGS

        return list(
            build_run_requests(
                list(self.last._requested_subsets),  # noqa: SLF001 - the daemon's own input
                self.graph,
                run_tags=RETRY_TAGS,
                emit_backfills=False,
            )
        )

    def ran(self, assets, version: str | None, failed: dict[str, str] | None = None) -> None:
        """What a successful run of ``assets`` for ``version`` leaves: materializations and its
        checks' verdicts (``failed``: check name -> asset, the checks that failed).
        """
        failed = failed or {}
        for asset in assets:
            key = dg.AssetKey(asset)
            self.instance.report_runless_asset_event(
                dg.AssetMaterialization(asset_key=key, partition=version)
            )
            (record,) = self.instance.fetch_materializations(
                dg.AssetRecordsFilter(
                    asset_key=key, asset_partitions=[version] if version else None
                ),
                limit=1,
            ).records
            # the materialization it checked (a run's check names it): a verdict on the current one
            target = AssetCheckEvaluationTargetMaterializationData(
                storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
            )
            for name in CHECKS.get(asset, ()):
                self.instance.report_runless_asset_event(
                    dg.AssetCheckEvaluation(
                        asset_key=key,
                        check_name=name,
                        passed=failed.get(name) != asset,
                        partition=version,
                        target_materialization_data=target,
                    )
                )
