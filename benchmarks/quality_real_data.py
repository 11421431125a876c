"""Quality on real data: the offline default model fine-tuned on shared/data/arabic_reviews vs the
majority class.

Uses the same functions as the assets (read_source -> validate -> the tokenize and shard slice
workers, as ``finetune_assets_tests/data_path.py`` runs them) and the same ``train()`` as torchrun,
in one CPU process. Run:

    python benchmarks/quality_real_data.py [--epochs 1] [--class-weights balanced]
    [--max-train-batches N]

Defaults: AdamW lr 1e-4 with 10% linear warmup, balanced class weights (the data is ~80% Positive),
max length 128, batch 16, length bucketing over 16 batches, one full epoch. About 25-40 minutes on 2
cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from finetune_assets.core.evaluation.evaluate import macro_f1
from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.prep.pretrained import (
    DEFAULT_MODEL,
    packaged_model_dir,
    save_pretrained_model,
)
from finetune_assets.core.prep.validate import ValidationRules, validate
from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.run import train

REVIEWS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "arabic_reviews"
if not REVIEWS.exists():
    REVIEWS = Path("/work/shared/data/arabic_reviews")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # finetune_assets_tests.data_path


def majority_macro_f1(test_labels: list[int], train_labels: list[int]) -> dict[str, float]:
    """Always predicting the training majority class, scored by the project's one macro-F1."""
    majority = Counter(train_labels).most_common(1)[0][0]
    truth, guess = np.asarray(test_labels), np.full(len(test_labels), majority)
    return {
        "majority_class": majority,
        "accuracy": float(np.mean(truth == guess)),
        "macro_f1": macro_f1(truth, guess),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--optimizer", default="adamw")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--class-weights", choices=("none", "balanced"), default="balanced")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bucket-batches", type=int, default=16)
    parser.add_argument("--max-train-batches", type=int, default=None)
    parser.add_argument("--out", default="benchmarks/results/quality_real_data.json")
    args = parser.parse_args()
    started = time.time()
    from finetune_assets_tests.data_path import prepare

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        summary = save_pretrained_model(DEFAULT_MODEL, None, root / "model")
        raw = read_source(SourceSpec(uri=str(REVIEWS)))
        validated = validate(raw, ValidationRules())
        tokenized, _ = prepare(validated.accepted, packaged_model_dir(), root, args.max_length)
        table = tokenized.table(columns=["label", "split"])
        split = table.column("split").cast(pa.string()).to_pylist()
        labels = table.column("label").to_pylist()
        counts = Counter(split)
        baseline = majority_macro_f1(
            [y for y, s in zip(labels, split) if s == "test"],
            [y for y, s in zip(labels, split) if s == "train"],
        )
        config = TrainerConfig.from_dict(
            {
                "model_dir": str(root / "model"),
                "output_dir": str(root / "out"),
                "checkpoint_dir": str(root / "ckpt"),
                "accelerator": "cpu",
                "epochs": args.epochs,
                "seed": 42,
                "log_every_n_steps": 50,
                "checkpoint_every_n_steps": 1000,
                "limit_train_batches": args.max_train_batches,
                "class_weights": args.class_weights,
                "optimizer": args.optimizer,
                "lr": args.lr,
                "warmup_ratio": args.warmup_ratio if args.optimizer == "adamw" else 0.0,
                "batch_size": args.batch_size,
                "num_workers": 1,
                "max_length": args.max_length,
                "bucket_batches": args.bucket_batches,
                "data": {
                    "train_url": str(root / "shards/train"),
                    "train_label_counts": read_split_stats(str(root / "shards/train")).counts(3),
                    "validation_url": str(root / "shards/validation"),
                    "test_url": str(root / "shards/test"),
                },
                "mlflow": {
                    "tracking_uri": f"sqlite:///{root}/mlflow.db",
                    "artifact_location": str(root / "mlartifacts"),
                    "log_model": False,
                },
            }
        )
        metrics = train(config)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "device": "cpu"},
        "wall_seconds": round(time.time() - started, 1),
        "model": summary.source,
        "parameters": summary.parameters,
        "data": {
            "source": "shared/data/arabic_reviews",
            "accepted": validated.accepted.num_rows,
            "rejected": validated.rejected.num_rows,
            "splits": dict(counts),
        },
        "recipe": {
            "optimizer": args.optimizer,
            "lr": args.lr,
            "warmup_ratio": args.warmup_ratio,
            "class_weights": args.class_weights,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "max_length": args.max_length,
            "bucket_batches": args.bucket_batches,
            "max_train_batches": args.max_train_batches,
        },
        "test": {
            k: metrics[k] for k in ("accuracy", "macro_f1", "f1_per_class", "confusion_matrix")
        },
        "majority_baseline": baseline,
        # A margin, not float noise: a model that predicts only the majority class must not "beat"
        # it.
        "beats_majority_macro_f1": metrics["macro_f1"] > baseline["macro_f1"] + 0.01,
        "train": {
            k: metrics[k]
            for k in (
                "samples_seen",
                "global_step",
                "samples_per_sec",
                "tokens_per_sec",
                "train_seconds",
            )
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
