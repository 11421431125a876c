"""``champion_model[v]``: the promotion decision for the model ``finetuned_model[v]`` registered in
this run.

The ``quality_gate`` check only scores and observes; this asset acts (moves the MLflow alias), so
the decision has its own lineage and history in the UI. It runs behind the gate (blocking check on
its upstream), in the ``promotion`` pool (limit 1, see docs/reliability.md) and under a storage
lock, and inside that critical section it re-reads the champion, compares, and sets: finish order
never decides.

``champion`` (unpartitioned, reported by ``champion_model`` whenever it moves the alias) is what the
UI shows without choosing a partition: the current champion of every label set, its dataset
version, score and since when.
"""

from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from finetune_assets.core.evaluation import gate_rules as gate
from finetune_assets.core.labels.infer import registered_model_name
from finetune_assets.defs.common import OWNERS, markdown_table, version_asset, version_of
from finetune_assets.defs.models.finetuned import TRAINING_BACKFILL, finetuned_model
from finetune_assets.defs.promotion.gate_check import (
    FloorConfig,
    frozen_test_set,
    gate_conditions,
    registered_at,
    version_labels,
)
from finetune_assets.defs.promotion.recorded_model import recorded_model
from finetune_assets.defs.resources.mlflow import REGISTRY_RETRY, MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource

PROMOTION_POOL = "promotion"
TAG_CHAMPION_SINCE = "gate.champion_since"  # ISO time the version took the alias

champion = dg.AssetSpec(
    "champion",
    deps=["champion_model"],
    group_name="models",
    kinds={"mlflow"},
    owners=OWNERS,
    code_version="1",
    description=(
        "The current champion of every label set (registered model): version, dataset version, "
        "macro-F1 and since when. Reported by champion_model[v] each time it moves the alias."
    ),
)


def champions(client, alias: str) -> list[tuple]:
    """(registered model, version, dataset version, macro-F1, since) per model holding ``alias``."""
    rows, token = [], None
    while True:
        page = client.search_registered_models(max_results=100, page_token=token)
        for rm in page:
            holder = (rm.aliases or {}).get(alias)
            if holder is None:
                continue
            tags = client.get_model_version(rm.name, str(holder)).tags or {}
            score = tags.get(gate.TAG_SCORE)
            rows.append(
                (
                    rm.name,
                    f"v{holder}",
                    tags.get("dataset_version", "?"),
                    f"{float(score):.4f}" if score else "?",
                    tags.get(TAG_CHAMPION_SINCE, "?"),
                )
            )
        token = page.token
        if not token:
            return sorted(rows)


def champion_report(client, alias: str, name: str, version: str) -> dg.AssetMaterialization:
    """The ``champion`` asset's materialization after ``name`` v``version`` took ``alias``."""
    rows = champions(client, alias)
    header = ("registered model (label set)", "version", "dataset version", "macro-F1", "since")
    return dg.AssetMaterialization(
        asset_key="champion",
        description=f"{name}@{alias} -> v{version}",
        metadata={
            "champions": markdown_table(header, rows),
            "changed": f"{name}@{alias} -> v{version}",
            "label_sets": len(rows),
        },
    )


class PromotionConfig(FloorConfig):
    min_improvement: float = Field(
        0.0, description="promote only if challenger > champion + this (a tie keeps the champion)"
    )


@version_asset(
    "models",
    {"mlflow"},
    deps=[finetuned_model],
    pool=PROMOTION_POOL,
    backfill_policy=TRAINING_BACKFILL,  # in the training run of a backfill, behind its model
    retry_policy=REGISTRY_RETRY,
    code_version="1",
)
def champion_model(
    context: dg.AssetExecutionContext,
    config: PromotionConfig,
    storage: StorageResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """Moves the champion alias to this run's model only if it is strictly better than the
    champion.
    """
    version = version_of(context)
    store = storage.storage()
    model = recorded_model(context.instance, version, context.run.run_id)
    if model.registered_model_version is None:
        raise dg.Failure(
            f"finetuned_model[{version}] (run {model.run_id}) registered no model version: "
            "nothing to promote (mlflow.log_model off?)",
            allow_retries=False,
        )
    name = model.registered_model_name or registered_model_name(
        mlflow.registered_model_name, version_labels(store, version)
    )
    alias = mlflow.champion_alias
    test = frozen_test_set(store, version)
    uri = mlflow.resolve_tracking_uri(store)
    client = mlflow.client(store)
    challenger_version = str(model.registered_model_version)
    cached = client.get_model_version(name, challenger_version).tags or {}
    if cached.get(gate.TAG_TEST_DATA) == test.fingerprint and gate.TAG_SCORE in cached:
        score = float(cached[gate.TAG_SCORE])
    else:
        score = gate.score_registered(client, name, challenger_version, test, uri)
    challenger = gate.Challenger(name, challenger_version, score, version)
    floor, _ = gate_conditions(config, test, store, version)
    conditions = [
        *floor,
        gate.not_older_than_champion(registered_at(store)),
        gate.beats_champion(config.min_improvement),
    ]
    result = gate.promote(
        client, challenger, test, conditions, uri, alias, lock=store.lock(f"promotion-{name}")
    )
    if result.promotable:  # the alias moved: say since when, and report the new champions
        since = datetime.now(UTC).isoformat(" ", "seconds")
        client.set_model_version_tag(name, challenger_version, TAG_CHAMPION_SINCE, since)
        context.log_event(champion_report(client, alias, name, challenger_version))
    decision = gate.describe(result, alias)
    context.log.info(decision)
    holder = (
        challenger_version
        if result.promotable or result.holds_alias
        else (result.champion.version if result.champion else None)
    )
    meta = {
        "decision": decision,
        "challenger": f"{name} v{challenger_version}",
        "challenger_macro_f1": dg.MetadataValue.float(score),
        "promoted": result.promotable,
        "champion": f"{name}@{alias} -> v{holder}" if holder else "none",
        "model_run": model.run_id,
    }
    if result.champion_score is not None:
        meta["previous_champion_macro_f1"] = dg.MetadataValue.float(result.champion_score)
    return dg.MaterializeResult(metadata=meta, data_version=dg.DataVersion(f"{name}:{holder}"))
