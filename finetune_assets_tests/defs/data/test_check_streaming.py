"""Checks read published Parquet a row group at a time and find what a whole read finds."""

from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq

from finetune_assets.core.evaluation.vocab_fit import sample_texts
from finetune_assets.core.io.contracts import iter_parquet_batches
from finetune_assets.defs.data.raw_contract import _scan_accepted, _scan_rejected
from finetune_assets.defs.data.vocab_check import _sampled_texts


def _write(path, table, row_group_size=7):
    with pq.ParquetWriter(path, table.schema) as w:
        w.write_table(table, row_group_size=row_group_size)
    return str(path)


def test_batches_cover_the_file_in_order(tmp_path):
    table = pa.table({"text": [f"t{i}" for i in range(50)], "label": ["Positive"] * 50})
    url = _write(tmp_path / "r.parquet", table)
    assert pq.ParquetFile(url).num_row_groups == 8
    rows = [
        t for b in iter_parquet_batches(url, None, ["text"]) for t in b.column("text").to_pylist()
    ]
    assert rows == table.column("text").to_pylist()


def test_contract_scans_count_as_a_whole_read(tmp_path):
    labels = ["Positive", "Negative", "Mixed", "Odd"] * 10
    texts = [f"review {i}" if i % 9 else "  " for i in range(40)]
    url = _write(tmp_path / "r.parquet", pa.table({"text": texts, "label": labels}))
    accepted = _scan_accepted(url, None)
    assert accepted.rows == 40 and accepted.labels == Counter(labels)
    assert accepted.empty_texts == sum(1 for t in texts if not t.strip())
    reasons = ["duplicate", "conflicting_duplicate", "malformed_row", "empty_text"] * 5
    rejected = pa.table(
        {
            "reason": reasons,
            "text": [f"x{i}" for i in range(20)],
            "source_file": ["f"] * 20,
            "source_row": list(range(20)),
        }
    )
    scan = _scan_rejected(_write(tmp_path / "q.parquet", rejected), None)
    assert scan.rows == 20 and scan.reasons == Counter(reasons)
    assert [r["source_row"] for r in scan.examples] == [2, 3, 6, 7, 10]  # first 5 non-duplicates
    assert [r["source_row"] for r in scan.conflicting] == [1, 5, 9, 13, 17]


def test_vocabulary_sample_is_the_whole_column_sample(tmp_path):
    texts = [f"review number {i}" for i in range(1000)]
    url = _write(tmp_path / "r.parquet", pa.table({"text": texts}), row_group_size=64)
    assert _sampled_texts(url, None, 37) == sample_texts(texts, 37)
    assert _sampled_texts(url, None, 5000) == texts
