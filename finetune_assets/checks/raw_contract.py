"""``raw_reviews``' data contract: schema, labels, quarantine and duplicate shares, class sizes."""

from collections import Counter
from collections.abc import Sequence

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from finetune_assets.checks.versioned import per_version_spec, version_of
from finetune_assets.contracts import RAW_REVIEWS as RAW
from finetune_assets.contracts import REJECTED_FILE, read_rejected, read_reviews
from finetune_assets.data.labels import labels_from_metadata
from finetune_assets.resources.storage_root import StorageResource
from finetune_assets.viz import markdown_table

DUPLICATE_REASONS = ("duplicate", "conflicting_duplicate")
EXAMPLES = 5


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
    per_version_spec(
        "schema_and_labels",
        RAW,
        "text/label columns as strings, no empty text, labels only the version's classes",
        blocking=True,
    ),
    per_version_spec(
        "rejected_share",
        RAW,
        "share of rows quarantined (not counting duplicates) under the limit",
        True,
    ),
    per_version_spec(
        "duplicate_share",
        RAW,
        "share of duplicate reviews under the limit (conflicting labels listed)",
        False,
    ),
    per_version_spec(
        "min_rows_per_class", RAW, "every class has enough accepted reviews to learn and test", True
    ),
]


@dg.multi_asset_check(specs=RAW_SPECS, name="raw_reviews_contract", can_subset=True)
def raw_reviews_contract(
    context: dg.AssetCheckExecutionContext, config: RawContractConfig, storage: StorageResource
):
    """The data contract of one dataset version, from its published reviews and quarantine."""
    version = version_of(context)
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
            fix="read rejected.parquet (reason + detail per row); fix the drop or raise "
            "max_rejected_share",
        )

    if "duplicate_share" in selected:
        dups = sum(reasons.get(r, 0) for r in DUPLICATE_REASONS)
        share = dups / rows_in if rows_in else 0.0
        conflicting = rejected.filter(pc.equal(rejected.column("reason"), "conflicting_duplicate"))
        yield result(
            "duplicate_share",
            share <= config.max_duplicate_share,
            dg.AssetCheckSeverity.WARN,
            f"{share:.2%} of rows are duplicates ({reasons.get('conflicting_duplicate', 0)} with a "
            f"conflicting label; limit {config.max_duplicate_share:.2%})",
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
            fix=_short_classes_fix(short, classes),
        )


def _short_classes_fix(short: dict[str, int], classes: Sequence[str]) -> str:
    """A class with no review at all is most often one the data never had: the version was
    registered with the default classes. Say how to declare them before suggesting more data.
    """
    if not short:
        return ""
    fix = "add reviews of the short classes to the drop, or lower min_rows_per_class"
    absent = sorted(k for k, v in short.items() if v == 0)
    if absent:
        fix = (
            f"no review is labelled {absent}, one of the version's classes {list(classes)}: if "
            "the data has no such class, register the version with its own classes (a _labels.json "
            "beside a landing drop's files, or finetune-assets versions add --labels); else " + fix
        )
    return fix


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
