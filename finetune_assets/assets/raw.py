"""``raw_reviews[v]``: the validated reviews of one dataset version (each with its split), the rejected rows beside them."""


import json

import dagster as dg
import pyarrow.parquet as pq
from pydantic import Field

from finetune_assets.assets._common import OWNERS, markdown_table, version_of
from finetune_assets.data.labels import DEFAULT_LABEL_SET, LabelError
from finetune_assets.data.sources import HF_PREFIX, SourceError, SourceSpec, is_builtin, list_source, read_source
from finetune_assets.contracts import LABELS_FILE, RAW_REVIEWS, REJECTED_FILE, REVIEWS_FILE
from finetune_assets.data.validate import SplitRule, ValidationRules, validate
from finetune_assets.partitions import dataset_versions
from finetune_assets.resources.storage import StorageResource
from finetune_assets.storage import hash_tree
from finetune_assets.versions import read_version


class RawReviewsConfig(dg.Config):
    """Overrides for the registered source of a version; empty fields keep the registered value."""

    source: str | None = Field(None, description="file/folder/fsspec URL, hf:owner/name, or builtin:NAME (rotten_tomatoes, imdb, sample)")
    revision: str | None = Field(None, description="Hugging Face dataset revision")
    text_column: str | None = None
    label_column: str | None = None
    encoding: str | None = Field(None, description="text encoding of CSV/TSV files, e.g. cp1256")
    label_mapping: dict[str, str] | None = Field(
        None, description="raw label -> class name of the version's label set (overrides its recorded mapping)")
    max_text_chars: int = Field(20_000, description="longer reviews are quarantined as too_long")
    validation_fraction: float = Field(0.1, description="share of reviews (by normalized-text hash) in validation")
    test_fraction: float = Field(0.1, description="share of reviews (by normalized-text hash) in test")


def resolve_source(config: RawReviewsConfig, storage, version: str) -> SourceSpec:
    record = read_version(storage, version)
    if config.source is None and record is None:
        raise dg.Failure(
            f"dataset version {version!r} has no registered source under {storage.root}; register it with "
            f"`finetune-assets versions add {version} --source PATH` or set raw_reviews config `source`"
        )
    base = record.source if record is not None else SourceSpec(uri=config.source)
    overrides = {k: getattr(config, k) for k in ("text_column", "label_column", "encoding", "revision")
                 if getattr(config, k) is not None}
    if config.source is not None:
        overrides["uri"] = config.source
    return SourceSpec(**{**base.__dict__, **overrides})


@dg.asset(
    partitions_def=dataset_versions,
    group_name="reviews",
    kinds={"parquet"},
    owners=OWNERS,
    code_version="1",
)
def raw_reviews(context: dg.AssetExecutionContext, config: RawReviewsConfig,
                storage: StorageResource) -> dg.MaterializeResult:
    """Validated reviews (text, class of the version's label set, split) of one dataset version; bad rows quarantined."""
    version = version_of(context)
    store = storage.storage()
    spec = resolve_source(config, store, version)
    record = read_version(store, version)
    labels = (record.label_set if record is not None else None) or DEFAULT_LABEL_SET
    try:
        split = SplitRule(config.validation_fraction, config.test_fraction)
    except ValueError as err:
        raise dg.Failure(f"raw_reviews config validation_fraction/test_fraction: {err}") from err
    try:
        rules = ValidationRules(max_text_chars=config.max_text_chars, labels=labels,
                                label_mapping=config.label_mapping or None, split=split)
    except LabelError as err:
        raise dg.Failure(f"raw_reviews config label_mapping: {err}") from err
    context.log.info(f"reading {spec.uri} for dataset version {version}")
    files = _files_metadata(context, spec)
    _refuse_changed_content(store, version, spec)
    try:
        raw = read_source(spec)
    except SourceError as err:
        raise dg.Failure(str(err)) from err
    result = validate(raw, rules)
    if result.accepted.num_rows + result.rejected.num_rows != raw.num_rows:  # the invariant we promise
        raise RuntimeError("validation lost rows: accepted + rejected != input")
    if result.cross_file_duplicates:
        context.log.warning(
            "reviews repeated across files (the copy in the file read first is kept; the others are in "
            f"rejected.parquet with reason duplicate / conflicting_duplicate): {result.cross_file_duplicates}")
    if result.accepted.num_rows == 0:
        raise dg.Failure(f"{spec.uri}: no valid reviews ({raw.num_rows} rows, rejected: {result.reasons})")
    with store.publish(RAW_REVIEWS, version) as staging:
        pq.write_table(result.accepted, staging.local_dir / REVIEWS_FILE, compression="zstd")
        pq.write_table(result.rejected, staging.local_dir / REJECTED_FILE, compression="zstd")
        (staging.local_dir / LABELS_FILE).write_text(json.dumps(rules.labels.to_dict(), ensure_ascii=False))
        # The labels are part of the data version (same reviews, other classes: another dataset).
        staging.data_version = hash_tree(staging.local_dir / REVIEWS_FILE)
        if rules.labels != DEFAULT_LABEL_SET:  # the seed's classes keep the data version they always had
            staging.data_version = f"{staging.data_version[:48]}-{rules.labels.fingerprint()}"
        staging.metadata = {"rows": result.accepted.num_rows, "rejected": result.rejected.num_rows,
                            "labels": rules.labels.to_dict()}
    n_in = raw.num_rows
    counts = result.label_counts
    return dg.MaterializeResult(
        metadata={
            "source": spec.uri,
            "path": dg.MetadataValue.path(f"{staging.url}/{REVIEWS_FILE}"),
            "rejected_path": dg.MetadataValue.path(f"{staging.url}/{REJECTED_FILE}"),
            "rows_in": n_in,
            "dagster/row_count": result.accepted.num_rows,
            "rejected_rows": result.rejected.num_rows,
            "rejected_share": round(result.rejected.num_rows / n_in, 4) if n_in else 0.0,
            "rejected_by_reason": dg.MetadataValue.json(result.reasons),
            "label_distribution": markdown_table(
                ("label", "reviews", "share"),
                [(k, v, f"{v / max(1, result.accepted.num_rows):.1%}") for k, v in counts.items()]),
            "label_counts": dg.MetadataValue.json(counts),
            "labels": ", ".join(rules.labels.names),
            "label_mapping": dg.MetadataValue.json(dict(rules.labels.mapping)),
            "malformed_lines": int(sum(1 for r in result.rejected.column("reason").to_pylist()
                                       if r == "malformed_row")),
            "cross_file_duplicates": dg.MetadataValue.json(result.cross_file_duplicates),
            **files,
            **_pictures(context, counts),
        },
        data_version=dg.DataVersion(staging.data_version),
    )


def _files_metadata(context: dg.AssetExecutionContext, spec: SourceSpec) -> dict:
    """Which files of a folder are read and which are ignored (and why): never a silent skip."""
    if is_builtin(spec.uri) or spec.uri.startswith(HF_PREFIX):
        return {}
    try:
        listing = list_source(spec.uri)
    except SourceError as err:
        raise dg.Failure(str(err)) from err
    if listing.ignored:
        context.log.info(f"ignored in {spec.uri}: " + "; ".join(f"{p} ({why})" for p, why in listing.ignored.items()))
    return {"files_read": dg.MetadataValue.json(listing.files),
            "files_ignored": dg.MetadataValue.json(listing.ignored)}


def _refuse_changed_content(store, version: str, spec: SourceSpec) -> None:
    """A version is immutable: its registered source must still hold the content fingerprinted at registration."""
    from finetune_assets.versions import content_changed

    problem = content_changed(store, version, spec)
    if problem:
        raise dg.Failure(problem)


# -- pictures for the UI (finetune_assets.viz) ----------------------------------------------------
def _pictures(context: dg.AssetExecutionContext, labels: dict[str, int]) -> dict[str, dg.MetadataValue]:
    """The label distribution as a bar chart; a plotting failure never fails the materialization."""
    from finetune_assets import viz

    try:
        return {"label_distribution": dg.MetadataValue.md(viz.label_distribution_md(labels))}
    except Exception as err:  # noqa: BLE001 - a missing picture is not worth a failed run
        context.log.warning(f"label distribution chart skipped: {err}")
        return {}
