"""Benchmark sets: external labelled review files that never train, frozen at registration.

``finetune-assets benchmarks add NAME --source FILE`` reads the file with the same readers as
dataset versions, maps its labels, and publishes a frozen copy under
``{root}/benchmark_sets/{NAME}/`` (atomic, like every asset output), so a later change of the file
cannot change a benchmark's history. ``benchmark_scores[v]`` scores each version's fine-tuned model
and baseline on every registered set. No Dagster here (the CLI uses it).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from finetune_assets.core.io.storage import Storage, hash_tree
from finetune_assets.core.labels.infer import DEFAULT_LABEL_MAPPING, normalize_value
from finetune_assets.core.sources import SourceSpec, read_source

ASSET = "benchmark_sets"
SET_FILE = "reviews.parquet"


@dataclass(frozen=True)
class BenchmarkSet:
    name: str
    texts: list[str]
    labels: list[str]
    info: dict  # source, label mapping, rows, label counts, registered_at, data_version


def read_labelled(spec: SourceSpec) -> tuple[list[str], list[str]]:
    """(texts, raw labels) of a labelled file, through the dataset readers; any unusable row refuses
    the file.

    Unreadable rows, empty texts and missing labels are named (file and row), never skipped: a score
    on a silently shrunk file is a different benchmark.
    """
    raw = read_source(spec)
    cols = [
        raw.column(c).to_pylist()
        for c in ("text", "label", "source_file", "source_row", "malformed")
    ]
    bad = []
    for t, lab, f, r, m in zip(*cols):
        if m is not None:
            bad.append(f"{f} row {r}: {m}")
        # non-text cells arrive flagged in ``malformed`` (data/sources/)
        elif t is None or not t.strip():
            bad.append(f"{f} row {r}: empty review")
        elif lab is None or not str(lab).strip():
            bad.append(f"{f} row {r}: no label (choose the column with --label-column)")
    if bad:
        raise ValueError(
            f"{spec.uri}: {len(bad)} unusable rows ({'; '.join(bad[:5])}); fix the file"
        )
    if not cols[0]:
        raise ValueError(f"{spec.uri}: no rows")
    return [t.strip() for t in cols[0]], [str(v).strip() for v in cols[1]]


def add_benchmark_set(
    storage: Storage, name: str, spec: SourceSpec, label_mapping: dict[str, str] | None = None
) -> dict:
    """Read, check and freeze a labelled file as benchmark set ``name``; returns its record.

    Unusable rows refuse the file (``read_labelled``). Labels are mapped (``label_mapping`` over the
    default 1/-1/0 mapping); a label nothing maps stays as written, and scoring refuses models that
    cannot predict it.
    """
    texts, raw_labels = read_labelled(spec)
    mapping = {
        normalize_value(k): v for k, v in {**DEFAULT_LABEL_MAPPING, **(label_mapping or {})}.items()
    }
    labels = [mapping.get(normalize_value(v)) or v.strip() for v in raw_labels]
    table = pa.table({"text": texts, "label": labels})
    with storage.publish(ASSET, name) as staging:
        pq.write_table(table, staging.local_dir / SET_FILE, compression="zstd")
        staging.data_version = hash_tree(staging.local_dir / SET_FILE)
        staging.metadata = {
            "name": name,
            "source": spec.uri,
            "label_mapping": label_mapping or {},
            "rows": table.num_rows,
            "label_counts": dict(Counter(labels)),
            "registered_at": time.time(),
        }
    return {**staging.metadata, "data_version": staging.data_version}


def list_benchmark_sets(storage: Storage) -> list[str]:
    base = storage.url(ASSET)
    if not storage.fs.exists(base):
        return []
    names = [e.rstrip("/").rsplit("/", 1)[-1] for e in storage.fs.ls(base, detail=False)]
    return sorted(n for n in names if storage.current(ASSET, n) is not None)


def read_benchmark_set(storage: Storage, name: str) -> BenchmarkSet:
    published = storage.current(ASSET, name)
    if published is None:
        raise FileNotFoundError(
            f"no benchmark set {name!r} under {storage.root} "
            f"(registered: {', '.join(list_benchmark_sets(storage)) or 'none'})"
        )
    with storage.fs.open(f"{published.url}/{SET_FILE}", "rb") as f:
        table = pq.read_table(f)
    return BenchmarkSet(
        name,
        table.column("text").to_pylist(),
        table.column("label").to_pylist(),
        {**published.metadata, "data_version": published.data_version},
    )
