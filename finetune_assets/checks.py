"""Asset checks guarding the graph's edges (data contract, shard integrity, model quality gate).

Checks read what the asset *published* (``Storage`` pointers), never in-memory state, so they can be
re-run alone from the UI. Severities: ERROR for what must stop the pipeline (blocking: downstream assets
in the same run do not execute; across runs, automation conditions wait for passing blocking checks),
WARN for what a person should look at but need not stop training. Thresholds are check config (the
launchpad's "ops" section, or ``run_config`` of a sensor/job), with defaults that fit the real data.
"""

from collections import Counter

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from finetune_assets.contracts import (
    BASELINE_MODEL,
    FINETUNED_MODEL,
    MDS_SHARDS,
    RAW_REVIEWS,
    REJECTED_FILE,
    SPLITS,
    TOKENIZED_REVIEWS,
    read_rejected,
    read_reviews,
    read_token_stats,
)
from finetune_assets.data.labels import labels_from_metadata, registered_model_name
from finetune_assets.dataset_versions.partitions import dataset_versions
from finetune_assets.resources.mlflow import REGISTRY_RETRY, MlflowResource
from finetune_assets.resources.storage_root import StorageResource
from finetune_assets.viz import markdown_table

RAW, TOKENIZED, SHARDS, FINETUNED = RAW_REVIEWS, TOKENIZED_REVIEWS, MDS_SHARDS, FINETUNED_MODEL
DUPLICATE_REASONS = ("duplicate", "conflicting_duplicate")
EXAMPLES = 5


def _spec(name: str, asset: str, description: str, blocking: bool, reads=()) -> dg.AssetCheckSpec:
    """A per-version check; ``reads`` are other assets it reads (lineage + ordering inside a run)."""
    return dg.AssetCheckSpec(
        name,
        asset=asset,
        description=description,
        blocking=blocking,
        partitions_def=dataset_versions,
        additional_deps=list(reads),
    )


def _version(context) -> str:
    from finetune_assets.dataset_versions.partitions import validate_version_key

    return validate_version_key(context.partition_key)


# -- raw_reviews: the data contract ---------------------------------------------------------------


class RawContractConfig(dg.Config):
    max_rejected_share: float = Field(
        0.05, description="largest share of input rows rejected for reasons other than duplicates"
    )
    max_duplicate_share: float = Field(
        0.05, description="largest share of input rows that are duplicates"
    )
    min_rows_per_class: int = Field(
        50, description="fewest accepted reviews per class of the version's label set"
    )


RAW_SPECS = [
    _spec(
        "schema_and_labels",
        RAW,
        "text/label columns as strings, no empty text, labels only the version's classes",
        blocking=True,
    ),
    _spec(
        "rejected_share",
        RAW,
        "share of rows quarantined (not counting duplicates) under the limit",
        True,
    ),
    _spec(
        "duplicate_share",
        RAW,
        "share of duplicate reviews under the limit (conflicting labels listed)",
        False,
    ),
    _spec(
        "min_rows_per_class", RAW, "every class has enough accepted reviews to learn and test", True
    ),
]


@dg.multi_asset_check(specs=RAW_SPECS, name="raw_reviews_contract", can_subset=True)
def raw_reviews_contract(
    context: dg.AssetCheckExecutionContext, config: RawContractConfig, storage: StorageResource
):
    """The data contract of one dataset version, from its published reviews and quarantine."""
    version = _version(context)
    store = storage.storage()
    pub = store.require(RAW, version)
    classes = labels_from_metadata(pub.metadata).names
    accepted = read_reviews(pub.url, store.fs)
    rejected = read_rejected(pub.url, store.fs)
    rows_in = accepted.num_rows + rejected.num_rows
    reasons = Counter(rejected.column("reason").to_pylist())
    where = dg.MetadataValue.path(f"{pub.url}/{REJECTED_FILE}")
    selected = {k.name for k in context.selected_asset_check_keys}

    def result(name, passed, severity, description, **metadata):
        return dg.AssetCheckResult(
            check_name=name,
            asset_key=RAW,
            passed=bool(passed),
            severity=severity,
            description=description,
            metadata=metadata,
        )

    if "schema_and_labels" in selected:
        problems = []
        for col in ("text", "label"):
            if col not in accepted.column_names:
                problems.append(f"missing column {col!r}")
            elif not pa.types.is_string(accepted.schema.field(col).type):
                problems.append(f"column {col!r} is {accepted.schema.field(col).type}, not string")
        unknown = {}
        if not problems:
            labels = Counter(accepted.column("label").to_pylist())
            unknown = {str(k): v for k, v in labels.items() if k not in classes}
            if unknown:
                problems.append(f"labels outside {list(classes)}: {unknown}")
            empty = int(
                pc.sum(
                    pc.equal(
                        pc.utf8_length(
                            pc.utf8_trim_whitespace(pc.fill_null(accepted.column("text"), ""))
                        ),
                        0,
                    )
                ).as_py()
                or 0
            )
            if empty:
                problems.append(f"{empty} accepted reviews have empty text")
        yield result(
            "schema_and_labels",
            not problems,
            dg.AssetCheckSeverity.ERROR,
            "; ".join(problems) or "schema and labels as promised",
            columns=dg.MetadataValue.json({f.name: str(f.type) for f in accepted.schema}),
            unexpected_labels=dg.MetadataValue.json(unknown),
            fix="fix the label mapping (raw_reviews config label_mapping) or the source files"
            if problems
            else "",
        )

    if "rejected_share" in selected:
        bad = {r: n for r, n in reasons.items() if r not in DUPLICATE_REASONS}
        share = sum(bad.values()) / rows_in if rows_in else 0.0
        examples = rejected.filter(
            pc.invert(pc.is_in(rejected.column("reason"), pa.array(DUPLICATE_REASONS)))
        )
        yield result(
            "rejected_share",
            share <= config.max_rejected_share,
            dg.AssetCheckSeverity.ERROR,
            f"{share:.2%} of {rows_in} rows rejected (limit {config.max_rejected_share:.2%})",
            rejected_share=round(share, 6),
            limit=config.max_rejected_share,
            rows_in=rows_in,
            rejected_by_reason=dg.MetadataValue.json(bad),
            rejected_path=where,
            examples=_examples(examples),
            fix="read rejected.parquet (reason + detail per row); fix the drop or raise max_rejected_share",
        )

    if "duplicate_share" in selected:
        dups = sum(reasons.get(r, 0) for r in DUPLICATE_REASONS)
        share = dups / rows_in if rows_in else 0.0
        conflicting = rejected.filter(pc.equal(rejected.column("reason"), "conflicting_duplicate"))
        yield result(
            "duplicate_share",
            share <= config.max_duplicate_share,
            dg.AssetCheckSeverity.WARN,
            f"{share:.2%} of rows are duplicates ({reasons.get('conflicting_duplicate', 0)} with a conflicting "
            f"label; limit {config.max_duplicate_share:.2%})",
            duplicate_share=round(share, 6),
            limit=config.max_duplicate_share,
            duplicates=dups,
            conflicting_duplicates=reasons.get("conflicting_duplicate", 0),
            conflicting_examples=_examples(conflicting),
            rejected_path=where,
        )

    if "min_rows_per_class" in selected:
        counts = Counter(accepted.column("label").to_pylist())
        per_class = {name: counts.get(name, 0) for name in classes}
        short = {k: v for k, v in per_class.items() if v < config.min_rows_per_class}
        yield result(
            "min_rows_per_class",
            not short,
            dg.AssetCheckSeverity.ERROR,
            (
                f"too few reviews for {short} (minimum {config.min_rows_per_class})"
                if short
                else f"every class has at least {config.min_rows_per_class} reviews"
            ),
            rows_per_class=dg.MetadataValue.json(per_class),
            minimum=config.min_rows_per_class,
            fix="add reviews of the short classes to the drop, or lower min_rows_per_class"
            if short
            else "",
        )


def _examples(table: pa.Table) -> dg.MetadataValue:
    rows = table.slice(0, EXAMPLES).to_pylist()
    table = markdown_table(
        ("file", "row", "reason", "detail", "text"),
        [
            (
                r["source_file"],
                r["source_row"],
                r["reason"],
                r.get("detail") or "",
                (r.get("text") or "")[:80],
            )
            for r in rows
        ],
    )
    return dg.MetadataValue.md(table if rows else "none")


# -- mds_shards: shard integrity --------------------------------------------------------------------

SHARD_SPECS = [
    _spec(
        "splits_readable",
        SHARDS,
        "every split opens and decodes with streaming.StreamingDataset",
        True,
        reads=[TOKENIZED],
    ),
    _spec(
        "counts_match_tokenized",
        SHARDS,
        "samples per split equal tokenized_reviews rows per split",
        True,
        reads=[TOKENIZED],
    ),
    _spec(
        "no_empty_split",
        SHARDS,
        "train, validation and test each hold at least one sample",
        True,
        reads=[TOKENIZED],
    ),
]


@dg.multi_asset_check(specs=SHARD_SPECS, name="mds_shards_integrity", can_subset=True)
def mds_shards_integrity(context: dg.AssetCheckExecutionContext, storage: StorageResource):
    """Shards as the trainer will read them, compared with the tokenized rows they came from."""
    from finetune_assets.data.shards import read_back_count

    version = _version(context)
    store = storage.storage()
    shards = store.require(SHARDS, version)
    tokens = store.require(TOKENIZED, version)
    published = read_token_stats(
        tokens.url, store.fs
    ).splits  # rows per split, as tokenized_reviews counted them
    expected = {s: published.get(s, 0) for s in SPLITS}
    seen: dict[str, int | None] = {}
    errors: dict[str, str] = {}
    with store.local_copy(shards.url) as local:
        for split in SPLITS:
            try:
                seen[split] = read_back_count(local / split)
            except Exception as err:  # noqa: BLE001 - any reader failure is the finding, reported per split
                seen[split], errors[split] = None, f"{type(err).__name__}: {err}"
    table = dg.MetadataValue.md(
        markdown_table(
            ("split", "tokenized rows", "MDS samples"),
            [(s, expected[s], seen[s] if seen[s] is not None else "unreadable") for s in SPLITS],
        )
    )
    selected = {k.name for k in context.selected_asset_check_keys}
    path = dg.MetadataValue.path(shards.url)

    def result(name, passed, description, **metadata):
        return dg.AssetCheckResult(
            check_name=name,
            asset_key=SHARDS,
            passed=bool(passed),
            severity=dg.AssetCheckSeverity.ERROR,
            description=description,
            metadata={"splits": table, "path": path, **metadata},
        )

    if "splits_readable" in selected:
        yield result(
            "splits_readable",
            not errors,
            "; ".join(f"{s}: {e}" for s, e in errors.items()) or "all splits readable",
            errors=dg.MetadataValue.json(errors),
            fix="re-materialize mds_shards for this version" if errors else "",
        )
    if "counts_match_tokenized" in selected:
        diff = {
            s: {"tokenized": expected[s], "mds": seen[s]} for s in SPLITS if seen[s] != expected[s]
        }
        yield result(
            "counts_match_tokenized",
            not diff,
            f"mismatched splits: {diff}" if diff else "every split matches tokenized_reviews",
            mismatches=dg.MetadataValue.json(diff),
            fix="re-materialize mds_shards (it may predate the current tokenized_reviews)"
            if diff
            else "",
        )
    if "no_empty_split" in selected:
        empty = [s for s in SPLITS if not seen[s]]
        yield result(
            "no_empty_split",
            not empty,
            f"empty splits: {empty}" if empty else "no empty split",
            empty_splits=dg.MetadataValue.json(empty),
            fix="add data, or change raw_reviews validation/test fractions" if empty else "",
        )


# -- finetuned_model: quality gate and promotion ----------------------------------------------------


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
        description="also require macro-F1 >= this version's baseline_model macro-F1 + margin (null: off; "
        "a version whose baseline_model was not built is refused while the rule is on)",
    )


class QualityGateConfig(FloorConfig):
    tolerance: float = Field(
        0.0,
        description="pass if challenger >= champion - tolerance (promotion itself "
        "needs strictly better: champion_model config min_improvement)",
    )


def gate_conditions(config: FloorConfig, test, store, version: str) -> tuple[list, dict]:
    """The conditions a challenger must meet, and what they were measured against (for metadata).

    The check and ``champion_model`` share them: the floor (absolute / majority class) and
    ``baseline_model[v]``'s test macro-F1 plus ``baseline_margin``; a missing baseline refuses (a
    rule that silently does not apply protects nobody) unless ``baseline_margin`` is null.
    """
    from finetune_assets import gate
    from finetune_assets.assets.baseline import read_baseline_info

    majority = gate.majority_baseline(test)
    floor = max(config.min_macro_f1, majority + 1e-9 if config.must_beat_majority_baseline else 0.0)
    conditions, about = [gate.above_floor(floor)], {"floor": floor}
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


@dg.asset_check(
    asset=FINETUNED,
    name="quality_gate",
    blocking=True,
    partitions_def=dataset_versions,
    additional_deps=[RAW, BASELINE_MODEL],
    retry_policy=REGISTRY_RETRY,
    description="Test macro-F1 of the model this materialization registered, vs the floor, its version's "
    "baseline_model and the current champion; observes only (champion_model moves the alias).",
)
def quality_gate(
    context: dg.AssetCheckExecutionContext,
    config: QualityGateConfig,
    storage: StorageResource,
    mlflow: MlflowResource,
) -> dg.AssetCheckResult:
    """Challenger and champion scored by one evaluator on this version's test texts; nothing is promoted here."""
    from mlflow import MlflowClient

    from finetune_assets import gate
    from finetune_assets.assets.finetuned import recorded_model

    version = _version(context)
    store = storage.storage()
    model = recorded_model(context.instance, version, context.run.run_id)
    # One registered model per label set: the champion is only ever a model of the same classes.
    name = model.registered_model_name or registered_model_name(
        mlflow.registered_model_name, version_labels(store, version)
    )
    test = frozen_test_set(store, version)
    uri = mlflow.resolve_tracking_uri(store)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)

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
                "decision": "not promoted: the trainer registered no model version (mlflow.log_model off?)",
            },
        )
    challenger = gate.Challenger(name, str(model.registered_model_version), score)
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
            f"macro-F1 {score:.4f} < champion v{result.champion.version}'s {result.champion_score:.4f} "
            f"on the same {len(test.texts)} test reviews"
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
    """Challenger, its version's baseline (+ margin) and the champion in one table (the gate's three numbers)."""
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
    """The frozen test split as text + label (raw_reviews' split column, as baseline_model reads it)."""
    from finetune_assets.assets.baseline import split_reviews
    from finetune_assets.gate import TestSet

    texts, labels = split_reviews(store, version)["test"]
    if not texts:
        raise dg.Failure(
            f"dataset version {version} has an empty test split: nothing to gate on",
            allow_retries=False,
        )
    return TestSet.build(texts, labels, version_labels(store, version).names)


asset_checks: list[dg.AssetChecksDefinition] = [
    raw_reviews_contract,
    mds_shards_integrity,
    quality_gate,
]
