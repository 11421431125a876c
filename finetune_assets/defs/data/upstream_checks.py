"""Blocking checks across runs: a step refuses inputs whose latest blocking check evaluation failed.

A blocking check stops the downstream steps of its own run only. Training is a run of its own (its
backfill policy differs from the data assets', jobs.py), so an asset backfill launches
``finetuned_model[v]`` once ``mds_shards[v]`` materialized, whatever its integrity check said, and a
check re-run alone (from the UI) that fails stops nothing. The consumer therefore asks the event log
itself: the latest evaluation of every blocking check on the data chain for ``v``.
"""

from __future__ import annotations

import dagster as dg

from finetune_assets.defs.dagster_internals import failed_check_evaluations
from finetune_assets.defs.data.raw_contract import RAW_SPECS
from finetune_assets.defs.data.shard_integrity import SHARD_SPECS

# Every blocking check on what training reads: the accepted reviews' contract and shard integrity.
BLOCKING_INPUT_CHECKS: tuple[dg.AssetCheckKey, ...] = tuple(
    spec.key for spec in (*RAW_SPECS, *SHARD_SPECS) if spec.blocking
)


def refuse_failed_inputs(instance: dg.DagsterInstance, version: str, consumer: str) -> None:
    """Raise a non-retried ``dg.Failure`` naming each blocking input check whose latest evaluation
    for ``version`` failed; return when none did.
    """
    failed = failed_check_evaluations(instance, BLOCKING_INPUT_CHECKS, version)
    if not failed:
        return
    why = {
        f"{k.asset_key.to_user_string()}:{k.name}": e.description or ""
        for k, e in sorted(failed.items(), key=lambda item: str(item[0]))
    }
    raise dg.Failure(
        description=(
            f"{consumer}[{version}] refused: the latest evaluation of blocking check(s) "
            f"{', '.join(why)} for {version} failed; fix the data and re-materialize it "
            "(its checks run with it) before training"
        ),
        metadata={"failed_checks": dg.MetadataValue.json(why)},
        allow_retries=False,
    )
