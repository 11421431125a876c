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
import pyarrow.parquet as pq
from pydantic import Field

from finetune_assets.data.labels import labels_from_metadata, registered_model_name
from finetune_assets.data.tokenize import SPLITS
from finetune_assets.partitions import dataset_versions
from finetune_assets.resources.mlflow import MlflowResource
from finetune_assets.resources.storage import StorageResource

RAW, TOKENIZED, SHARDS, FINETUNED = "raw_reviews", "tokenized_reviews", "mds_shards", "finetuned_model"
REVIEWS_FILE, REJECTED_FILE, TOKENS_FILE = "reviews.parquet", "rejected.parquet", "tokens.arrow"
DUPLICATE_REASONS = ("duplicate", "conflicting_duplicate")
EXAMPLES = 5


def _spec(name: str, asset: str, description: str, blocking: bool, reads=()) -> dg.AssetCheckSpec:
    """A per-version check; ``reads`` are other assets it reads (lineage + ordering inside a run)."""
    return dg.AssetCheckSpec(name, asset=asset, description=description, blocking=blocking,
                             partitions_def=dataset_versions, additional_deps=list(reads))


def _version(context) -> str:
    from finetune_assets.partitions import validate_version_key

    return validate_version_key(context.partition_key)


# -- raw_reviews: the data contract ---------------------------------------------------------------

class RawContractConfig(dg.Config):
    max_rejected_share: float = Field(
        0.05, description="largest share of input rows rejected for reasons other than duplicates")
    max_duplicate_share: float = Field(0.05, description="largest share of input rows that are duplicates")
    min_rows_per_class: int = Field(50, description="fewest accepted reviews per class of the version's label set")


RAW_SPECS = [
    _spec("schema_and_labels", RAW, "text/label columns as strings, no empty text, labels only the "
          "version's classes", blocking=True),
    _spec("rejected_share", RAW, "share of rows quarantined (not counting duplicates) under the limit", True),
    _spec("duplicate_share", RAW, "share of duplicate reviews under the limit (conflicting labels listed)", False),
    _spec("min_rows_per_class", RAW, "every class has enough accepted reviews to learn and test", True),
]


@dg.multi_asset_check(specs=RAW_SPECS, name="raw_reviews_contract", can_subset=True)
def raw_reviews_contract(context: dg.AssetCheckExecutionContext, config: RawContractConfig,
                         storage: StorageResource):
    """The data contract of one dataset version, from its published reviews and quarantine."""
    version = _version(context)
    store = storage.storage()
    pub = store.require(RAW, version)
    classes = labels_from_metadata(pub.metadata).names
    with store.fs.open(f"{pub.url}/{REVIEWS_FILE}", "rb") as f:
        accepted = pq.read_table(f)
    with store.fs.open(f"{pub.url}/{REJECTED_FILE}", "rb") as f:
        rejected = pq.read_table(f)
    rows_in = accepted.num_rows + rejected.num_rows
    reasons = Counter(rejected.column("reason").to_pylist())
    where = dg.MetadataValue.path(f"{pub.url}/{REJECTED_FILE}")
    selected = {k.name for k in context.selected_asset_check_keys}

    def result(name, passed, severity, description, **metadata):
        return dg.AssetCheckResult(check_name=name, asset_key=RAW, passed=bool(passed), severity=severity,
                                   description=description, metadata=metadata)

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
            empty = int(pc.sum(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(
                pc.fill_null(accepted.column("text"), ""))), 0)).as_py() or 0)
            if empty:
                problems.append(f"{empty} accepted reviews have empty text")
        yield result("schema_and_labels", not problems, dg.AssetCheckSeverity.ERROR,
                     "; ".join(problems) or "schema and labels as promised",
                     columns=dg.MetadataValue.json({f.name: str(f.type) for f in accepted.schema}),
                     unexpected_labels=dg.MetadataValue.json(unknown),
                     fix="fix the label mapping (raw_reviews config label_mapping) or the source files"
                     if problems else "")

    if "rejected_share" in selected:
        bad = {r: n for r, n in reasons.items() if r not in DUPLICATE_REASONS}
        share = sum(bad.values()) / rows_in if rows_in else 0.0
        examples = rejected.filter(pc.invert(pc.is_in(rejected.column("reason"), pa.array(DUPLICATE_REASONS))))
        yield result(
            "rejected_share", share <= config.max_rejected_share, dg.AssetCheckSeverity.ERROR,
            f"{share:.2%} of {rows_in} rows rejected (limit {config.max_rejected_share:.2%})",
            rejected_share=round(share, 6), limit=config.max_rejected_share, rows_in=rows_in,
            rejected_by_reason=dg.MetadataValue.json(bad), rejected_path=where,
            examples=_examples(examples),
            fix="read rejected.parquet (reason + detail per row); fix the drop or raise max_rejected_share",
        )

    if "duplicate_share" in selected:
        dups = sum(reasons.get(r, 0) for r in DUPLICATE_REASONS)
        share = dups / rows_in if rows_in else 0.0
        conflicting = rejected.filter(pc.equal(rejected.column("reason"), "conflicting_duplicate"))
        yield result(
            "duplicate_share", share <= config.max_duplicate_share, dg.AssetCheckSeverity.WARN,
            f"{share:.2%} of rows are duplicates ({reasons.get('conflicting_duplicate', 0)} with a conflicting "
            f"label; limit {config.max_duplicate_share:.2%})",
            duplicate_share=round(share, 6), limit=config.max_duplicate_share, duplicates=dups,
            conflicting_duplicates=reasons.get("conflicting_duplicate", 0),
            conflicting_examples=_examples(conflicting), rejected_path=where,
        )

    if "min_rows_per_class" in selected:
        counts = Counter(accepted.column("label").to_pylist())
        per_class = {name: counts.get(name, 0) for name in classes}
        short = {k: v for k, v in per_class.items() if v < config.min_rows_per_class}
        yield result(
            "min_rows_per_class", not short, dg.AssetCheckSeverity.ERROR,
            (f"too few reviews for {short} (minimum {config.min_rows_per_class})" if short
             else f"every class has at least {config.min_rows_per_class} reviews"),
            rows_per_class=dg.MetadataValue.json(per_class), minimum=config.min_rows_per_class,
            fix="add reviews of the short classes to the drop, or lower min_rows_per_class" if short else "",
        )


def _examples(table: pa.Table) -> dg.MetadataValue:
    rows = table.slice(0, EXAMPLES).to_pylist()
    lines = ["| file | row | reason | detail | text |", "|---|---|---|---|---|"]
    for r in rows:
        text = (r.get("text") or "")[:80].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['source_file']} | {r['source_row']} | {r['reason']} | {r.get('detail') or ''} | {text} |")
    return dg.MetadataValue.md("\n".join(lines) if rows else "none")


# -- mds_shards: shard integrity --------------------------------------------------------------------

SHARD_SPECS = [
    _spec("splits_readable", SHARDS, "every split opens and decodes with streaming.StreamingDataset", True,
          reads=[TOKENIZED]),
    _spec("counts_match_tokenized", SHARDS, "samples per split equal tokenized_reviews rows per split", True,
          reads=[TOKENIZED]),
    _spec("no_empty_split", SHARDS, "train, validation and test each hold at least one sample", True,
          reads=[TOKENIZED]),
]


@dg.multi_asset_check(specs=SHARD_SPECS, name="mds_shards_integrity", can_subset=True)
def mds_shards_integrity(context: dg.AssetCheckExecutionContext, storage: StorageResource):
    """Shards as the trainer will read them, compared with the tokenized rows they came from."""
    from finetune_assets.data.shards import read_back_count

    version = _version(context)
    store = storage.storage()
    shards = store.require(SHARDS, version)
    tokens = store.require(TOKENIZED, version)
    with store.fs.open(f"{tokens.url}/{TOKENS_FILE}", "rb") as f:
        split_col = pa.ipc.open_file(pa.BufferReader(f.read())).read_all().column("split").cast(pa.string())
    expected = {s: int(pc.sum(pc.equal(split_col, s)).as_py() or 0) for s in SPLITS}
    seen: dict[str, int | None] = {}
    errors: dict[str, str] = {}
    with store.local_copy(shards.url) as local:
        for split in SPLITS:
            try:
                seen[split] = read_back_count(local / split)
            except Exception as err:  # noqa: BLE001 - any reader failure is the finding, reported per split
                seen[split], errors[split] = None, f"{type(err).__name__}: {err}"
    table = dg.MetadataValue.md("\n".join(
        ["| split | tokenized rows | MDS samples |", "|---|---|---|"]
        + [f"| {s} | {expected[s]} | {seen[s] if seen[s] is not None else 'unreadable'} |" for s in SPLITS]))
    selected = {k.name for k in context.selected_asset_check_keys}
    path = dg.MetadataValue.path(shards.url)

    def result(name, passed, description, **metadata):
        return dg.AssetCheckResult(check_name=name, asset_key=SHARDS, passed=bool(passed),
                                   severity=dg.AssetCheckSeverity.ERROR, description=description,
                                   metadata={"splits": table, "path": path, **metadata})

    if "splits_readable" in selected:
        yield result("splits_readable", not errors,
                     "; ".join(f"{s}: {e}" for s, e in errors.items()) or "all splits readable",
                     errors=dg.MetadataValue.json(errors),
                     fix="re-materialize mds_shards for this version" if errors else "")
    if "counts_match_tokenized" in selected:
        diff = {s: {"tokenized": expected[s], "mds": seen[s]} for s in SPLITS if seen[s] != expected[s]}
        yield result("counts_match_tokenized", not diff,
                     f"mismatched splits: {diff}" if diff else "every split matches tokenized_reviews",
                     mismatches=dg.MetadataValue.json(diff),
                     fix="re-materialize mds_shards (it may predate the current tokenized_reviews)" if diff else "")
    if "no_empty_split" in selected:
        empty = [s for s in SPLITS if not seen[s]]
        yield result("no_empty_split", not empty,
                     f"empty splits: {empty}" if empty else "no empty split",
                     empty_splits=dg.MetadataValue.json(empty),
                     fix="add data, or change tokenized_reviews validation/test fractions" if empty else "")


# -- finetuned_model: quality gate and promotion ----------------------------------------------------

class QualityGateConfig(dg.Config):
    alias: str = Field("champion", description="MLflow registered-model alias the gate moves")
    min_macro_f1: float = Field(0.0, description="absolute floor on test macro-F1 (0: only the champion counts)")
    must_beat_majority_baseline: bool = Field(
        False, description="also require a macro-F1 above always predicting the most frequent class")
    tolerance: float = Field(0.0, description="promote if challenger >= champion - tolerance")


@dg.asset_check(asset=FINETUNED, name="quality_gate", blocking=True, partitions_def=dataset_versions,
                additional_deps=[RAW, TOKENIZED],
                description="Test macro-F1 on the frozen test split vs the current champion; promotes the "
                            "model (MLflow alias) only if it is not worse.")
def quality_gate(context: dg.AssetCheckExecutionContext, config: QualityGateConfig, storage: StorageResource,
                 mlflow: MlflowResource) -> dg.AssetCheckResult:
    """Challenger and champion scored by one evaluator on this version's test texts; alias moved if not worse."""
    from mlflow import MlflowClient

    from finetune_assets import gate

    version = _version(context)
    store = storage.storage()
    model = store.require(FINETUNED, version)
    info = model.metadata.get("mlflow") or {}
    labels = labels_from_metadata(store.require(RAW, version).metadata)
    # One registered model per label set: the champion is only ever a model of the same classes.
    name = info.get("registered_model_name") or registered_model_name(mlflow.registered_model_name, labels)
    challenger = info.get("registered_model_version")
    test = _test_set(store, version, labels)
    uri = mlflow.resolve_tracking_uri(store)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)

    with store.local_copy(f"{model.url}/model") as local:
        score = gate.score_model(local, test)
    baseline = gate.majority_baseline(test)
    meta = {"dataset_version": version, "test_reviews": len(test.texts), "test_data": test.fingerprint,
            "challenger_macro_f1": dg.MetadataValue.float(score),
            "majority_baseline_macro_f1": dg.MetadataValue.float(baseline),
            "model_path": dg.MetadataValue.path(f"{model.url}/model"),
            "registered_model": f"{name} v{challenger}" if challenger else "not registered"}
    if challenger is None:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata={
            **meta, "decision": "not promoted: the trainer registered no model version (mlflow.log_model off?)"})
    challenger = str(challenger)
    gate.remember_score(client, name, challenger, test, score)

    floor = max(config.min_macro_f1, baseline + 1e-9 if config.must_beat_majority_baseline else 0.0)
    if score < floor:
        decision = f"refused: macro-F1 {score:.4f} is below the floor {floor:.4f}"
        _tag_decision(client, name, challenger, decision)
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR,
                                   description=decision, metadata={**meta, "decision": decision, "floor": floor})

    for _ in range(3):  # re-compare if another run moved the alias while we scored
        champ = gate.current_champion(client, name, test, config.alias)
        if champ is None:
            champ_score, decision = None, f"promoted: first model to hold @{config.alias}"
        elif champ.version == challenger:
            champ_score, decision = score, f"already @{config.alias}"
        else:
            champ_score = champ.cached_score
            if champ_score is None:
                context.log.info(f"scoring champion {name} v{champ.version} on {version}'s test split")
                champ_score = gate.score_registered(client, name, champ.version, test, uri)
            meta.update(champion=f"{name} v{champ.version}", champion_dataset_version=champ.dataset_version or "",
                        champion_macro_f1=dg.MetadataValue.float(champ_score),
                        delta_macro_f1=dg.MetadataValue.float(score - champ_score))
            if score + config.tolerance < champ_score:
                decision = (f"refused: macro-F1 {score:.4f} < champion v{champ.version}'s {champ_score:.4f} "
                            f"on the same {len(test.texts)} test reviews; @{config.alias} stays on v{champ.version}")
                _tag_decision(client, name, challenger, decision)
                return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR,
                                           description=decision, metadata={**meta, "decision": decision})
            decision = (f"promoted: macro-F1 {score:.4f} >= champion v{champ.version}'s {champ_score:.4f} "
                        f"on the same {len(test.texts)} test reviews")
        current = gate.current_champion(client, name, test, config.alias)
        if (current.version if current else None) == (champ.version if champ else None):
            client.set_registered_model_alias(name, config.alias, challenger)
            break
    else:
        raise dg.Failure(f"@{config.alias} of {name} kept moving while the gate compared; re-run the check")
    _tag_decision(client, name, challenger, decision)
    context.log.info(decision)
    return dg.AssetCheckResult(passed=True, description=decision,
                               metadata={**meta, "decision": decision, "alias": f"{name}@{config.alias} -> v{challenger}"})


def _tag_decision(client, name: str, version: str, decision: str) -> None:
    from finetune_assets.gate import TAG_DECISION

    client.set_model_version_tag(name, version, TAG_DECISION, decision[:250])


def _test_set(store, version: str, labels):
    """The frozen test split as text + label: tokenized_reviews' split column over raw_reviews' rows."""
    from finetune_assets.gate import TestSet

    raw = store.require(RAW, version)
    tokens = store.require(TOKENIZED, version)
    with store.fs.open(f"{raw.url}/{REVIEWS_FILE}", "rb") as f:
        reviews = pq.read_table(f, columns=["text", "label"])
    with store.fs.open(f"{tokens.url}/{TOKENS_FILE}", "rb") as f:
        splits = pa.ipc.open_file(pa.BufferReader(f.read())).read_all().column("split").cast(pa.string())
    if len(splits) != reviews.num_rows:
        raise dg.Failure(f"{tokens.url}/{TOKENS_FILE} has {len(splits)} rows but {raw.url}/{REVIEWS_FILE} has "
                         f"{reviews.num_rows}: re-materialize tokenized_reviews[{version}]")
    test = reviews.filter(pc.equal(splits, "test"))
    if test.num_rows == 0:
        raise dg.Failure(f"dataset version {version} has an empty test split: nothing to gate on")
    return TestSet.build(test.column("text").to_pylist(), test.column("label").to_pylist(), labels.names)


asset_checks: list[dg.AssetChecksDefinition] = [raw_reviews_contract, mds_shards_integrity, quality_gate]
