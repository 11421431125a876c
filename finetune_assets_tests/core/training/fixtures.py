"""MDS fixtures with exactly the schema the ``mds_shards`` asset writes, from real reviews."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
from streaming import MDSWriter

COLUMNS = {"input_ids": "ndarray:uint16", "label": "int8"}
POLARITY = {"1": 0, "-1": 1, "0": 2}  # Positive / Negative / Mixed


def read_reviews(csv_path: Path, limit: int) -> list[tuple[str, int]]:
    """The first ``limit`` reviews of each label (balanced, deterministic)."""
    per_label: dict[int, list[tuple[str, int]]] = {0: [], 1: [], 2: []}
    with open(csv_path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            label = POLARITY.get((row.get("polarity") or "").strip())
            text = (row.get("text") or "").strip()
            if label is None or not text or len(per_label[label]) >= limit:
                continue
            per_label[label].append((text, label))
    rows = [
        r
        for i in range(limit)
        for lbl in (0, 1, 2)
        if i < len(per_label[lbl])
        for r in [per_label[lbl][i]]
    ]
    return rows


def write_split(
    out: Path, ids: list[list[int]], labels: list[int], size_limit: int = 1 << 14
) -> Path:
    """One flat MDS split of made-up token rows, ``split_stats.json`` beside it: trainer input
    (the data path's own output is ``finetune_assets_tests/data_path.py``'s).
    """
    from finetune_assets.core.io.contracts import SPLIT_STATS_FILE, SplitStats

    out.mkdir(parents=True, exist_ok=True)
    with MDSWriter(out=str(out), columns=COLUMNS, compression="zstd", size_limit=size_limit) as w:
        for seq, label in zip(ids, labels):
            w.write({"input_ids": np.asarray(seq, dtype=np.uint16), "label": int(label)})
    values, counts = np.unique(np.asarray(labels, dtype=np.int64), return_counts=True)
    stats = SplitStats(len(labels), dict(zip(values.tolist(), counts.tolist())))
    (out / SPLIT_STATS_FILE).write_text(stats.to_json())  # what the trainer's class weights read
    return out


def write_mds_splits(
    root: Path,
    tokenizer_dir: Path,
    reviews_csv: Path,
    sizes: tuple[int, int, int] = (96, 24, 24),
    max_length: int = 64,
) -> Path:
    """``root/{train,validation,test}``: tokenized real reviews (unpadded, with [CLS]/[SEP])."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    need = sum(sizes)
    rows = read_reviews(reviews_csv, limit=need // 3 + 1)[:need]
    if len(rows) < need:
        raise ValueError(f"{reviews_csv} has only {len(rows)} usable reviews, {need} needed")
    enc = tok([t for t, _ in rows], truncation=True, max_length=max_length)["input_ids"]
    start = 0
    for split, n in zip(("train", "validation", "test"), sizes):
        write_split(
            root / split, enc[start : start + n], [lbl for _, lbl in rows[start : start + n]]
        )
        start += n
    return root


def publish_upstream(
    store,
    version: str,
    tiny_model_dir: Path,
    reviews_csv: Path,
    sizes: tuple[int, int, int] = (96, 24, 24),
) -> None:
    """Publish ``pretrained_model`` (the tiny BERT) and ``mds_shards[version]`` as the real
    assets would.
    """
    from finetune_assets.core.io.storage import hash_tree

    with store.publish("pretrained_model") as staging:
        shutil.copytree(tiny_model_dir, staging.local_dir, dirs_exist_ok=True)
        staging.data_version = hash_tree(staging.local_dir)
    with store.publish("mds_shards", version) as staging:
        write_mds_splits(staging.local_dir, tiny_model_dir, reviews_csv, sizes=sizes)
        staging.data_version = hash_tree(staging.local_dir)
