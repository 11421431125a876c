"""Asset checks guarding the graph's edges (data contract, shard integrity, model quality gate).

Checks read what the asset *published* (``Storage`` pointers), never in-memory state, so they can be
re-run alone from the UI. Severities: ERROR for what must stop the pipeline (blocking: downstream
assets in the same run do not execute; across runs, automation conditions wait for passing blocking
checks), WARN for what a person should look at but need not stop training. Thresholds are check
config (the launchpad's "ops" section, or ``run_config`` of a sensor/job), with defaults that fit
the real data. One module per guarded asset: :mod:`.raw_contract`, :mod:`.shard_integrity`,
:mod:`.quality_gate`.
"""

import dagster as dg

from finetune_assets.checks.quality_gate import (
    FloorConfig,
    QualityGateConfig,
    frozen_test_set,
    gate_conditions,
    quality_gate,
    version_labels,
)
from finetune_assets.checks.raw_contract import RawContractConfig, raw_reviews_contract
from finetune_assets.checks.shard_integrity import mds_shards_integrity

__all__ = [
    "FloorConfig",
    "QualityGateConfig",
    "RawContractConfig",
    "asset_checks",
    "frozen_test_set",
    "gate_conditions",
    "mds_shards_integrity",
    "quality_gate",
    "raw_reviews_contract",
    "version_labels",
]

asset_checks: list[dg.AssetChecksDefinition] = [
    raw_reviews_contract,
    mds_shards_integrity,
    quality_gate,
]
