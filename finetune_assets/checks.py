"""Asset checks guarding the graph's edges (data contract, shard integrity, model quality gate)."""

import dagster as dg

asset_checks: list[dg.AssetChecksDefinition] = []
