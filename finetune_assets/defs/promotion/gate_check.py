"""``finetuned_model``'s quality gate: the floor, the version's baseline and the champion.

It observes only; ``champion_model`` (which shares :class:`FloorConfig` and :func:`gate_conditions`)
moves the alias.
"""

import dagster as dg
from pydantic import Field

from finetune_assets.core.evaluation import gate_rules as gate
from finetune_assets.core.evaluation.charts import markdown_table
from finetune_assets.core.evaluation.gate_rules import TestSet
from finetune_assets.core.io.contracts import BASELINE_MODEL
from finetune_assets.core.io.contracts import FINETUNED_MODEL as FINETUNED
from finetune_assets.core.io.contracts import RAW_REVIEWS as RAW
from finetune_assets.core.labels.infer import labels_from_metadata, registered_model_name
from finetune_assets.defs.common import version_check, version_of
from finetune_assets.defs.models.baseline_model import read_baseline_info, split_reviews
from finetune_assets.defs.promotion.recorded_model import recorded_model
from finetune_assets.defs.resources.mlflow import REGISTRY_RETRY, MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.register import read_version


class FloorConfig(dg.Config):
    """The floor a model must clear, shared by ``quality_gate`` and ``champion_model``."""

    min_macro_f1: float = Field(
        0.0, description="absolute floor on test macro-F1 (0: only the champion counts)"
    )
    must_beat_majority_baseline: bool = Field(
        True,
        description="also require a macro-F1 above always predicting the most frequent class "
        "(first champion included)",
    )
    baseline_margin: float | None = Field(
        0.0,
        description="also require macro-F1 >= this version's baseline_model macro-F1 + margin "
        "(null: off; a version whose baseline_model was not built is refused while the rule is on)",
    )


class QualityGateConfig(FloorConfig):
    tolerance: float = Field(
        0.0,
        description="pass if challenger >= champion - tolerance (promotion itself "
        "needs strictly better: champion_model config min_improvement)",
    )


def registered_at(store):
    """When a dataset version was registered (its registry record), None when it has none."""

    def registered_at(version: str) -> float | None:
        record = read_version(store, version)
        return record.registered_at if record is not None and record.registered_at else None

    return registered_at


def gate_conditions(config: FloorConfig, test, store, version: str) -> tuple[list, dict]:
    """The conditions a challenger must meet, and what they were measured against (for metadata).

    The check and ``champion_model`` share them: the floor (absolute / majority class) and
    ``baseline_model[v]``'s test macro-F1 plus ``baseline_margin``; a missing baseline refuses (a
    rule that silently does not apply protects nobody) unless ``baseline_margin`` is null. The
    order rule (``gate.not_older_than_champion``) is ``champion_model``'s alone: it is about who
    holds the alias, not about the model's quality, so an asset backfill that trains versions in
    any order passes every good model's gate and promotes none but the newest.
    """
    majority = gate.majority_baseline(test)
    floor = max(config.min_macro_f1, majority + 1e-9 if config.must_beat_majority_baseline else 0.0)
    conditions = [gate.above_floor(floor)]
    about: dict = {"floor": floor}
    if config.baseline_margin is None:
        about["baseline_decision"] = "off (baseline_margin: null)"
        return conditions, about
    info = read_baseline_info(store, version)
    if not info or not info.get("test"):
        missing = (
            f"baseline_model[{version}] is not materialized (or has no test scores): the "
            "baseline rule cannot be checked (baseline_margin: null turns it off)"
        )
        about["baseline_decision"] = f"refused: {missing}"
        conditions.append(lambda _comparison: missing)
        return conditions, about
    about.update(
        baseline_macro_f1=float(info["test"]["macro_f1"]), baseline_margin=config.baseline_margin
    )
    conditions.append(gate.beats_baseline(info["test"], config.baseline_margin))
    return conditions, about


@version_check(
    asset=FINETUNED,
    name="quality_gate",
    blocking=True,
    additional_deps=[RAW, BASELINE_MODEL],
    retry_policy=REGISTRY_RETRY,
    description="Test macro-F1 of the model this materialization registered, vs the floor, its "
    "version's baseline_model and the current champion; observes only (champion_model moves "
    "the alias).",
)
def quality_gate(
    context: dg.AssetCheckExecutionContext,
    config: QualityGateConfig,
    storage: StorageResource,
    mlflow: MlflowResource,
) -> dg.AssetCheckResult:
    """Challenger and champion scored alike on this version's test set; promotes nothing."""
    version = version_of(context)
    store = storage.storage()
    model = recorded_model(context.instance, version, context.run.run_id)
    # One registered model per label set: the champion is only ever a model of the same classes.
    name = model.registered_model_name or registered_model_name(
        mlflow.registered_model_name, version_labels(store, version)
    )
    test = frozen_test_set(store, version)
    uri = mlflow.resolve_tracking_uri(store)
    client = mlflow.client(store)

    with store.local_copy(model.model_url) as local:
        score = gate.score_model(local, test)
    baseline = gate.majority_baseline(test)
    meta = {
        "dataset_version": version,
        "test_reviews": len(test.texts),
        "test_data": test.fingerprint,
        "challenger_macro_f1": dg.MetadataValue.float(score),
        "majority_baseline_macro_f1": dg.MetadataValue.float(baseline),
        "model_path": dg.MetadataValue.path(model.model_url),
        "materialized_by_run": model.run_id,
        "registered_model": f"{name} v{model.registered_model_version}"
        if model.registered_model_version
        else "not registered",
    }
    if model.registered_model_version is None:
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                **meta,
                "decision": "not promoted: the trainer registered no model version "
                "(mlflow.log_model off?)",
            },
        )
    challenger = gate.Challenger(name, str(model.registered_model_version), score, version)
    gate.remember_score(client, name, challenger.version, test, score)
    floor, about = gate_conditions(config, test, store, version)
    result = gate.compare(
        client, challenger, test, [*floor, gate.beats_champion()], uri, mlflow.champion_alias
    )
    meta["decision"] = gate.describe(result, mlflow.champion_alias).replace(
        "promoted:", "will promote:", 1
    )
    meta.update(_side_by_side(version, score, about, result))
    if result.champion is not None:
        meta.update(
            champion=f"{name} v{result.champion.version}",
            champion_dataset_version=result.champion.dataset_version or "",
            champion_macro_f1=dg.MetadataValue.float(result.champion_score),
            delta_macro_f1=dg.MetadataValue.float(score - result.champion_score),
        )
    worse = result.champion_score is not None and score + config.tolerance < result.champion_score
    problems = [r for cond in floor if (r := cond(result)) is not None]
    if worse:
        problems.append(
            f"macro-F1 {score:.4f} < champion v{result.champion.version}'s "
            f"{result.champion_score:.4f} on the same {len(test.texts)} test reviews"
        )
    if problems:
        decision = "refused: " + "; ".join(problems)
        client.set_model_version_tag(name, challenger.version, gate.TAG_DECISION, decision[:250])
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            description=decision,
            metadata={**meta, "decision": decision},
        )
    context.log.info(f"quality gate: {meta['decision']}")
    return dg.AssetCheckResult(passed=True, description=meta["decision"], metadata=meta)


def _side_by_side(version: str, score: float, about: dict, result) -> dict:
    """The gate's three numbers in one table: challenger, baseline + margin, champion."""
    baseline = about.get("baseline_macro_f1")
    champ = result.champion
    rows = [
        ("challenger", f"{score:.4f}"),
        (
            f"baseline_model[{version}] + margin {about.get('baseline_margin', 0):.4f}",
            f"{baseline:.4f}" if baseline is not None else about.get("baseline_decision", ""),
        ),
        (
            f"champion{f' v{champ.version}' if champ else ''}",
            f"{result.champion_score:.4f}" if result.champion_score is not None else "none",
        ),
    ]
    meta = {
        "scores": dg.MetadataValue.md(markdown_table(("model", "test macro-F1"), rows)),
        "floor": about["floor"],
    }
    if baseline is not None:
        meta.update(
            baseline_macro_f1=dg.MetadataValue.float(baseline),
            baseline_margin=about["baseline_margin"],
        )
    else:
        meta["baseline_decision"] = about["baseline_decision"]
    return meta


def version_labels(store, version: str):
    """The label set ``raw_reviews[v]`` published (the version's classes, in id order)."""
    return labels_from_metadata(store.require(RAW, version).metadata)


def frozen_test_set(store, version: str):
    """The frozen test split as text + label (raw_reviews' split column, as baseline_model)."""
    texts, labels = split_reviews(store, version)["test"]
    if not texts:
        raise dg.Failure(
            f"dataset version {version} has an empty test split: nothing to gate on",
            allow_retries=False,
        )
    return TestSet.build(texts, labels, version_labels(store, version).names)
