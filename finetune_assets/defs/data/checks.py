"""Asset checks guarding the graph's edges (data contract, shard integrity, model quality gate).

Checks read what the asset *published* (``Storage`` pointers), never in-memory state, so they can be
re-run alone from the UI. Severities: ERROR for what must stop the pipeline (blocking: downstream
assets in the same run do not execute; across runs, automation conditions wait for passing blocking
checks), WARN for what a person should look at but need not stop training. Thresholds are check
config (the launchpad's "ops" section, or ``run_config`` of a sensor/job), with defaults that fit
the real data. One module per guarded asset: :mod:`.raw_contract`, :mod:`.shard_integrity`; the
model's ``quality_gate`` lives with promotion (``finetune_assets/defs/promotion/gate_check.py``).
"""

import dagster as dg

from finetune_assets.defs.data.raw_contract import RawContractConfig, raw_reviews_contract
from finetune_assets.defs.data.shard_integrity import mds_shards_integrity

__all__ = [
    "RawContractConfig",
    "asset_checks",
    "mds_shards_integrity",
    "raw_reviews_contract",
]

asset_checks: list[dg.AssetChecksDefinition] = [
    raw_reviews_contract,
    mds_shards_integrity,
]
