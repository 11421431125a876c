"""``raw_reviews``' data contract: schema, labels, quarantine and duplicate shares, class sizes."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from finetune_assets.core.evaluation.charts import markdown_table
from finetune_assets.core.io.contracts import RAW_REVIEWS as RAW
from finetune_assets.core.io.contracts import (
    REJECTED_FILE,
    REVIEWS_FILE,
    iter_parquet_batches,
    parquet_schema,
)
from finetune_assets.core.labels.infer import labels_from_metadata
from finetune_assets.defs.common import version_check_spec, version_of
from finetune_assets.defs.resources.storage_root import StorageResource

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
    version_check_spec(
        "schema_and_labels",
        RAW,
        "text/label columns as strings, no empty text, labels only the version's classes",
        blocking=True,
    ),
    version_check_spec(
        "rejected_share",
        RAW,
        "share of rows quarantined (not counting duplicates) under the limit",
        True,
    ),
    version_check_spec(
        "duplicate_share",
        RAW,
        "share of duplicate reviews under the limit (conflicting labels listed)",
        False,
    ),
    version_check_spec(
        "min_rows_per_class", RAW, "every class has enough accepted reviews to learn and test", True
    ),
]


@dg.multi_asset_check(specs=RAW_SPECS, name="raw_reviews_contract", can_subset=True)
def raw_reviews_contract(
    context: dg.AssetCheckExecutionContext, config: RawContractConfig, storage: StorageResource
):
    """The data contract of one dataset version, from its published reviews and quarantine, read a
    record batch at a time (the check never holds a whole version in memory).
    """
    version = version_of(context)
    store = storage.storage()
    pub = store.require(RAW, version)
    scan = _Scan(
        classes=labels_from_metadata(pub.metadata).names,
        accepted=_scan_accepted(f"{pub.url}/{REVIEWS_FILE}", store.fs),
        rejected=_scan_rejected(f"{pub.url}/{REJECTED_FILE}", store.fs),
        rejected_path=dg.MetadataValue.path(f"{pub.url}/{REJECTED_FILE}"),
    )
    selected = {k.name for k in context.selected_asset_check_keys}
    for name, rule in _RULES.items():
        if name in selected:
            yield rule(scan, config)


def _result(name, passed, severity, description, **metadata) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=name,
        asset_key=RAW,
        passed=bool(passed),
        severity=severity,
        description=description,
        metadata=metadata,
    )


def _schema_and_labels(scan: "_Scan", config: RawContractConfig) -> dg.AssetCheckResult:
    accepted, classes = scan.accepted, scan.classes
    problems = list(accepted.schema_problems)
    unknown = {}
    if not problems:
        unknown = {str(k): v for k, v in accepted.labels.items() if k not in classes}
        if unknown:
            problems.append(f"labels outside {list(classes)}: {unknown}")
        if accepted.empty_texts:
            problems.append(f"{accepted.empty_texts} accepted reviews have empty text")
    return _result(
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


def _rejected_share(scan: "_Scan", config: RawContractConfig) -> dg.AssetCheckResult:
    rows_in = scan.rows_in
    bad = {r: n for r, n in scan.rejected.reasons.items() if r not in DUPLICATE_REASONS}
    share = sum(bad.values()) / rows_in if rows_in else 0.0
    return _result(
        "rejected_share",
        share <= config.max_rejected_share,
        dg.AssetCheckSeverity.ERROR,
        f"{share:.2%} of {rows_in} rows rejected (limit {config.max_rejected_share:.2%})",
        rejected_share=round(share, 6),
        limit=config.max_rejected_share,
        rows_in=rows_in,
        rejected_by_reason=dg.MetadataValue.json(bad),
        rejected_path=scan.rejected_path,
        examples=_examples(scan.rejected.examples),
        fix="read rejected.parquet (reason + detail per row); fix the drop or raise "
        "max_rejected_share",
    )


def _duplicate_share(scan: "_Scan", config: RawContractConfig) -> dg.AssetCheckResult:
    reasons = scan.rejected.reasons
    dups = sum(reasons.get(r, 0) for r in DUPLICATE_REASONS)
    share = dups / scan.rows_in if scan.rows_in else 0.0
    return _result(
        "duplicate_share",
        share <= config.max_duplicate_share,
        dg.AssetCheckSeverity.WARN,
        f"{share:.2%} of rows are duplicates ({reasons.get('conflicting_duplicate', 0)} with a "
        f"conflicting label; limit {config.max_duplicate_share:.2%})",
        duplicate_share=round(share, 6),
        limit=config.max_duplicate_share,
        duplicates=dups,
        conflicting_duplicates=reasons.get("conflicting_duplicate", 0),
        conflicting_examples=_examples(scan.rejected.conflicting),
        rejected_path=scan.rejected_path,
    )


def _min_rows_per_class(scan: "_Scan", config: RawContractConfig) -> dg.AssetCheckResult:
    per_class = {name: scan.accepted.labels.get(name, 0) for name in scan.classes}
    short = {k: v for k, v in per_class.items() if v < config.min_rows_per_class}
    return _result(
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
        fix=_short_classes_fix(short, scan.classes),
    )


# each check of the contract, in the order they report
_RULES = {
    "schema_and_labels": _schema_and_labels,
    "rejected_share": _rejected_share,
    "duplicate_share": _duplicate_share,
    "min_rows_per_class": _min_rows_per_class,
}


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


@dataclass
class _Accepted:
    """What the contract needs of the accepted reviews, from one pass over their record batches."""

    schema: pa.Schema
    rows: int = 0
    labels: Counter = field(default_factory=Counter)
    empty_texts: int = 0
    schema_problems: list[str] = field(default_factory=list)


def _scan_accepted(url: str, fs) -> _Accepted:
    schema = parquet_schema(url, fs)
    out = _Accepted(schema=schema)
    for col in ("text", "label"):
        if col not in schema.names:
            out.schema_problems.append(f"missing column {col!r}")
        elif not pa.types.is_string(schema.field(col).type):
            out.schema_problems.append(f"column {col!r} is {schema.field(col).type}, not string")
    if out.schema_problems:
        return out
    for batch in iter_parquet_batches(url, fs, columns=["text", "label"]):
        out.rows += batch.num_rows
        counts = pc.value_counts(batch.column("label"))
        for entry in counts.to_pylist():
            out.labels[entry["values"]] += entry["counts"]
        blank = pc.equal(
            pc.utf8_length(pc.utf8_trim_whitespace(pc.fill_null(batch.column("text"), ""))), 0
        )
        out.empty_texts += int(pc.sum(blank).as_py() or 0)
    return out


@dataclass
class _Rejected:
    """The quarantine's counts per reason and the first few example rows the metadata shows."""

    rows: int = 0
    reasons: Counter = field(default_factory=Counter)
    examples: list[dict] = field(default_factory=list)  # not a duplicate
    conflicting: list[dict] = field(default_factory=list)  # conflicting duplicates


def _scan_rejected(url: str, fs) -> _Rejected:
    out = _Rejected()
    for batch in iter_parquet_batches(url, fs):
        out.rows += batch.num_rows
        reason = batch.column("reason")
        for entry in pc.value_counts(reason).to_pylist():
            out.reasons[entry["values"]] += entry["counts"]
        if len(out.examples) < EXAMPLES:
            other = batch.filter(pc.invert(pc.is_in(reason, pa.array(DUPLICATE_REASONS))))
            out.examples += other.slice(0, EXAMPLES - len(out.examples)).to_pylist()
        if len(out.conflicting) < EXAMPLES:
            both = batch.filter(pc.equal(reason, "conflicting_duplicate"))
            out.conflicting += both.slice(0, EXAMPLES - len(out.conflicting)).to_pylist()
    return out


@dataclass
class _Scan:
    """One pass over a version's accepted reviews and quarantine: what every rule reads."""

    classes: Sequence[str]  # the version's label set, in id order
    accepted: _Accepted
    rejected: _Rejected
    rejected_path: dg.MetadataValue

    @property
    def rows_in(self) -> int:
        return self.accepted.rows + self.rejected.rows


def _examples(rows: list[dict]) -> dg.MetadataValue:
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
