"""``raw_reviews[v]``: the validated reviews of one dataset version (each with its split), the
rejected rows beside them.
"""

import hashlib
import json
from typing import Any, ClassVar, Literal

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.io.contracts import (
    ACCEPTED_SCHEMA,
    LABELS_FILE,
    RAW_REVIEWS,
    REJECTED_FILE,
    REJECTED_SCHEMA,
    REVIEWS_FILE,
)
from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET, LabelError
from finetune_assets.core.prep.conflicts import accepted_after, promoted_rows, rejected_after
from finetune_assets.core.prep.validate import SplitRule, StreamValidator, ValidationRules
from finetune_assets.core.sources import (
    SourceError,
    SourceSpec,
    describe_source,
    is_file_source,
    iter_source,
    list_source,
)
from finetune_assets.defs.common import markdown_table, version_asset, version_of
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.register import VersionRecord, content_changed, read_version


class RawReviewsConfig(dg.Config):
    """Overrides for the registered source of a version; empty fields keep the registered value."""

    # the data version hashes rows, not row groups
    unversioned: ClassVar[tuple[str, ...]] = ("batch_rows",)

    source: str | None = Field(
        None,
        description=(
            "file/folder/fsspec URL, hf:owner/name, builtin:NAME (rotten_tomatoes, imdb, sample), "
            "delta:PATH_OR_URL[@version=N] or sql:ENV_NAME (registered versions are pinned)"
        ),
    )
    revision: str | None = Field(None, description="Hugging Face dataset revision")
    text_column: str | None = None
    label_column: str | None = None
    encoding: str | None = Field(None, description="text encoding of CSV/TSV files, e.g. cp1256")
    label_mapping: dict[str, str] | None = Field(
        None,
        description="raw label -> class name of the version's label set (overrides its recorded "
        "mapping)",
    )
    max_text_chars: int = Field(20_000, description="longer reviews are quarantined as too_long")
    validation_fraction: float = Field(
        0.1, description="share of reviews (by normalized-text hash) in validation"
    )
    test_fraction: float = Field(
        0.1, description="share of reviews (by normalized-text hash) in test"
    )
    duplicate_conflicts: Literal["majority", "first"] = Field(
        "majority",
        description="copies of a review with different labels: majority (3+ copies, more than "
        "half agree) wins, else all quarantined; first: the first copy read is kept",
    )
    batch_rows: int = Field(
        16_384,
        description="rows validated and written per Parquet row group (the unit "
        "tokenized_reviews slices by); memory is bounded by this and the "
        "source block size (SOURCE_BLOCK_BYTES, 8 MiB)",
    )


# Input bytes read per source block. A block's parsed rows cost ~10x its bytes in Python objects,
# and a file reaches that steady state after a few blocks, so half the readers' 16 MiB default keeps
# the peak flat from 0.1M rows (a ~27 MB file) to millions (benchmarks/scale.py --one-big-file).
SOURCE_BLOCK_BYTES = 8 << 20


def resolve_source(config: RawReviewsConfig, storage, version: str) -> SourceSpec:
    record = read_version(storage, version)
    if config.source is None and record is None:
        raise dg.Failure(
            f"dataset version {version!r} has no registered source under {storage.root}; "
            "register it with "
            f"`finetune-assets versions add {version} --source PATH` or set raw_reviews config "
            "`source`"
        )
    base = record.source if record is not None else SourceSpec(uri=config.source)
    overrides = {
        k: getattr(config, k)
        for k in ("text_column", "label_column", "encoding", "revision")
        if getattr(config, k) is not None
    }
    if config.source is not None:
        overrides["uri"] = config.source
    return SourceSpec(**{**base.__dict__, **overrides})


# code version 2: the split is a hash of the coarse split key (letters and digits), not the
# normalized text, so near-duplicates share a split; versions built under 1 are shown stale
@version_asset("reviews", {"parquet"}, code_version="2")
def raw_reviews(
    context: dg.AssetExecutionContext, config: RawReviewsConfig, storage: StorageResource
) -> dg.MaterializeResult:
    """Validated reviews (text, class, split) of one dataset version; bad rows quarantined."""
    version = version_of(context)
    store = storage.storage()
    spec = resolve_source(config, store, version)
    rules = _rules(config, read_version(store, version))
    context.log.info(f"reading {spec.uri} for dataset version {version}")
    files = _files_metadata(context, spec)
    _refuse_changed_content(store, version, spec)
    validator = StreamValidator(rules)
    try:
        with store.publish(RAW_REVIEWS, version) as staging:
            digest = _stream_validated(
                spec, validator, staging.local_dir, config.batch_rows, context
            )
            digest = (
                _resolve_conflicts(validator, staging.local_dir, config.batch_rows, context)
                or digest
            )
            if validator.accepted == 0:
                raise dg.Failure(
                    f"{spec.uri}: no valid reviews ({validator.rows_in} rows, rejected: "
                    f"{dict(validator.reasons)})"
                )
            (staging.local_dir / LABELS_FILE).write_text(
                json.dumps(rules.labels.to_dict(), ensure_ascii=False)
            )
            # The labels are part of the data version (same reviews, other classes: another
            # dataset).
            staging.data_version = digest
            # the default three classes keep the data version they always had
            if rules.labels != DEFAULT_LABEL_SET:
                staging.data_version = f"{staging.data_version[:48]}-{rules.labels.fingerprint()}"
            staging.metadata = {
                "rows": validator.accepted,
                "rejected": validator.rejected,
                "labels": rules.labels.to_dict(),
            }
    finally:
        validator.close()
    if validator.across:
        context.log.warning(
            "reviews repeated across files (the copy in the file read first is kept; the others "
            "are in rejected.parquet with reason duplicate / conflicting_duplicate): "
            f"{dict(validator.across)}"
        )
    return dg.MaterializeResult(
        metadata={
            "source": spec.uri,
            "path": dg.MetadataValue.path(f"{staging.url}/{REVIEWS_FILE}"),
            "rejected_path": dg.MetadataValue.path(f"{staging.url}/{REJECTED_FILE}"),
            **_validation_metadata(context, validator),
            **files,
            **_pictures(context, validator.label_counts),
        },
        data_version=dg.DataVersion(staging.data_version),
    )


def _rules(config: RawReviewsConfig, record: VersionRecord | None) -> ValidationRules:
    """The validation rules of the version: its label set (the default three classes for a record
    without one) and the config's limits, split and mapping; a config that cannot be fails.
    """
    labels = (record.label_set if record is not None else None) or DEFAULT_LABEL_SET
    try:
        split = SplitRule(config.validation_fraction, config.test_fraction)
    except ValueError as err:
        raise dg.Failure(f"raw_reviews config validation_fraction/test_fraction: {err}") from err
    try:
        return ValidationRules(
            max_text_chars=config.max_text_chars,
            labels=labels,
            label_mapping=config.label_mapping or None,
            split=split,
            duplicate_conflicts=config.duplicate_conflicts,
        )
    except LabelError as err:
        raise dg.Failure(f"raw_reviews config label_mapping: {err}") from err


def _validation_metadata(
    context: dg.AssetExecutionContext, validator: StreamValidator
) -> dict[str, Any]:
    """What validation accepted and rejected, and the labels it mapped to."""
    n_in = validator.rows_in
    counts = validator.label_counts
    reasons = dict(validator.reasons)
    labels = validator.rules.labels
    return {
        "rows_in": n_in,
        "dagster/row_count": validator.accepted,
        "dagster/column_schema": dg.TableSchema(
            columns=[dg.TableColumn(f.name, str(f.type)) for f in ACCEPTED_SCHEMA]
        ),
        "rejected_rows": validator.rejected,
        "rejected_share": round(validator.rejected / n_in, 4) if n_in else 0.0,
        "rejected_by_reason": dg.MetadataValue.json(reasons),
        "label_distribution": markdown_table(
            ("label", "reviews", "share"),
            [(k, v, f"{v / max(1, validator.accepted):.1%}") for k, v in counts.items()],
        ),
        "label_counts": dg.MetadataValue.json(counts),
        "labels": ", ".join(labels.names),
        "label_mapping": dg.MetadataValue.json(dict(labels.mapping)),
        "malformed_lines": int(reasons.get("malformed_row", 0)),
        "cross_file_duplicates": dg.MetadataValue.json(dict(validator.across)),
    }


def _stream_validated(
    spec: SourceSpec,
    validator: StreamValidator,
    out,
    batch_rows: int,
    context: dg.AssetExecutionContext,
) -> str:
    """Source -> validated Parquet files, one batch in memory at a time; returns the accepted rows'
    content hash.

    Accepted rows are written in row groups of ``batch_rows`` (the unit ``tokenized_reviews`` slices
    by). The hash covers every accepted row's fields, each row terminated, so it does not depend on
    batching.
    """
    digest = hashlib.sha256()
    pending: list[pa.Table] = []
    with (
        pq.ParquetWriter(out / REVIEWS_FILE, ACCEPTED_SCHEMA, compression="zstd") as good,
        pq.ParquetWriter(out / REJECTED_FILE, REJECTED_SCHEMA, compression="zstd") as bad,
    ):

        def flush(final: bool) -> None:
            table = (
                pa.concat_tables(pending).combine_chunks()
                if pending
                else ACCEPTED_SCHEMA.empty_table()
            )
            pending.clear()
            while table.num_rows >= batch_rows or (final and table.num_rows):
                head, table = table.slice(0, batch_rows), table.slice(batch_rows)
                good.write_table(head, row_group_size=batch_rows)
            if table.num_rows:
                pending.append(table)

        try:
            for file_table in iter_source(spec, block_bytes=SOURCE_BLOCK_BYTES):
                for start in range(0, max(file_table.num_rows, 1), batch_rows):
                    result = validator.feed(file_table.slice(start, batch_rows))
                    _digest_rows(digest, result.accepted)
                    if result.rejected.num_rows:
                        bad.write_table(result.rejected)
                    pending.append(result.accepted)
                    if sum(t.num_rows for t in pending) >= batch_rows:
                        flush(final=False)
                context.log.info(
                    f"validated {validator.rows_in} rows ({validator.accepted} accepted)"
                )
            flush(final=True)
        except SourceError as err:
            raise dg.Failure(str(err)) from err
    return digest.hexdigest()[:16]


def _digest_rows(digest, table: pa.Table) -> None:
    for row in zip(*(table.column(n).to_pylist() for n in ACCEPTED_SCHEMA.names)):
        digest.update("\x1f".join(map(str, row)).encode() + b"\x1e")


def _resolve_conflicts(validator: StreamValidator, out, batch_rows: int, context) -> str | None:
    """Apply the duplicate policy (data.conflicts) once every copy is seen: both files rewritten a
    row group at a time, the counters and the content hash recomputed; None (nothing read again)
    without conflicts.
    """
    plan = validator.conflicts()
    if not plan:
        return None
    context.log.info(
        f"conflicting duplicates: {len(plan.drop_accepted)} first copies quarantined, "
        f"{len(plan.promote)} majority copies accepted instead"
    )

    def groups(name: str):
        f = pq.ParquetFile(out / name)
        return (f.read_row_group(i) for i in range(f.num_row_groups))

    split_of = validator.rules.split.split_of_text
    promoted = promoted_rows(plan, groups(REJECTED_FILE), split_of, ACCEPTED_SCHEMA)
    moved: list[dict] = []
    digest = hashlib.sha256()
    first = True
    with pq.ParquetWriter(out / f"{REVIEWS_FILE}.new", ACCEPTED_SCHEMA, compression="zstd") as good:
        for table in accepted_after(plan, groups(REVIEWS_FILE), promoted, moved, REJECTED_SCHEMA):
            _digest_rows(digest, table)
            good.write_table(table, row_group_size=batch_rows)
            validator.recount(table, REJECTED_SCHEMA.empty_table(), first)
            first = False
    with pq.ParquetWriter(out / f"{REJECTED_FILE}.new", REJECTED_SCHEMA, compression="zstd") as bad:
        for table in rejected_after(plan, groups(REJECTED_FILE), moved, REJECTED_SCHEMA):
            bad.write_table(table)
            validator.recount(ACCEPTED_SCHEMA.empty_table(), table, first=False)
    for name in (REVIEWS_FILE, REJECTED_FILE):
        (out / f"{name}.new").replace(out / name)
    return digest.hexdigest()[:16]


def _files_metadata(context: dg.AssetExecutionContext, spec: SourceSpec) -> dict:
    """Which files of a folder are read and which are ignored (and why): never a silent skip; for
    a table, which version of it (or which content) is read.
    """
    if not is_file_source(spec.uri):
        try:
            described = {k: v for k, v in describe_source(spec).items() if v is not None}
        except SourceError as err:
            raise dg.Failure(str(err)) from err
        if "delta_version" in described:
            table, pinned, latest = (
                described[k] for k in ("delta_table", "delta_version", "delta_latest_version")
            )
            now = (
                f"time travel: the table is now at version {latest}"
                if latest != pinned
                else "its latest"
            )
            context.log.info(
                f"reading Delta table {table} at version {pinned}, as registered ({now})"
            )
        return described
    try:
        listing = list_source(spec.uri)
    except SourceError as err:
        raise dg.Failure(str(err)) from err
    if listing.ignored:
        context.log.info(
            f"ignored in {spec.uri}: "
            + "; ".join(f"{p} ({why})" for p, why in listing.ignored.items())
        )
    return {
        "files_read": dg.MetadataValue.json(listing.files),
        "files_ignored": dg.MetadataValue.json(listing.ignored),
    }


def _refuse_changed_content(store, version: str, spec: SourceSpec) -> None:
    """A version is immutable: its registered source must still hold the content fingerprinted at
    registration.
    """
    problem = content_changed(store, version, spec)
    if problem:
        raise dg.Failure(problem)


# -- pictures for the UI (finetune_assets.core.evaluation.charts)
# ----------------------------------------------------
def _pictures(
    context: dg.AssetExecutionContext, labels: dict[str, int]
) -> dict[str, dg.MetadataValue]:
    """The label distribution as a bar chart; a plotting failure never fails the materialization."""
    try:
        chart = viz.label_distribution_md(labels)  # its own key: the table stays beside it
        return {"label_distribution_chart": dg.MetadataValue.md(chart)}
    except Exception as err:  # a missing picture is not worth a failed run
        context.log.warning(f"label distribution chart skipped: {err}")
        return {}
