"""Is the fine-tuned model any good? Majority class, the TF-IDF baseline and the fine-tuned default
model, on the same hash split (the project's ``SplitRule``) of one real data set.

    # one epoch on CPU
    python benchmarks/quality_baseline.py --data english --source reviews.csv --finetune
    # shared/data/arabic_reviews, no training
    python benchmarks/quality_baseline.py --data arabic

``--data english`` needs ``--source``: a labelled English review file you supply (any format and
columns ``raw_reviews`` reads). The recorded English numbers were measured on 3,000 reviews of the
Women's E-Commerce Clothing Reviews set (CC0, Kaggle nicapotato), which the project does not ship:
reproducing them needs that file.

The baseline is ``finetune_assets.core.evaluation.baseline`` (what ``baseline_model`` trains),
scored with
``finetune_assets.core.evaluation.evaluate.scores`` (what the gate and ``evaluate`` use).
``--finetune`` trains
the packaged all-MiniLM-L6-v2 with the same pure functions and ``train()`` as the assets, in one CPU
process. Results are merged into ``benchmarks/results/quality_baseline.json`` under ``{data}`` /
``{recipe}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from finetune_assets.core.evaluation.baseline import BaselineModel, BaselineSettings
from finetune_assets.core.evaluation.evaluate import majority_scores
from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.labels.infer import LABELS
from finetune_assets.core.prep.validate import SplitRule, ValidationRules, validate
from finetune_assets.core.sources import SourceSpec, read_source

ARABIC = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "arabic_reviews"
if not ARABIC.exists():
    ARABIC = Path("/work/shared/data/arabic_reviews")
DATA = ("arabic", "english")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # finetune_assets_tests.data_path
KEEP = ("samples", "accuracy", "macro_f1", "f1_per_class", "confusion_matrix")


def finetune(accepted: pa.Table, args) -> dict:
    from finetune_assets.core.prep.pretrained import (
        DEFAULT_MODEL,
        packaged_model_dir,
        save_pretrained_model,
    )
    from finetune_assets.core.training.config import TrainerConfig
    from finetune_assets.core.training.run import train
    from finetune_assets_tests.data_path import prepare

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_pretrained_model(DEFAULT_MODEL, None, root / "model")
        prepare(accepted, packaged_model_dir(), root, args.max_length)
        config = TrainerConfig.from_dict(
            {
                "model_dir": str(root / "model"),
                "output_dir": str(root / "out"),
                "checkpoint_dir": str(root / "ckpt"),
                "accelerator": "cpu",
                "epochs": args.epochs,
                "seed": 42,
                "log_every_n_steps": 50,
                "checkpoint_every_n_steps": 100000,
                "class_weights": args.class_weights,
                "optimizer": "adamw",
                "lr": args.lr,
                "warmup_ratio": 0.1,
                "batch_size": args.batch_size,
                "num_workers": 0,
                "max_length": args.max_length,
                "bucket_batches": args.bucket_batches,
                "data": {
                    "train_url": str(root / "shards/train"),
                    "train_label_counts": read_split_stats(str(root / "shards/train")).counts(
                        len(LABELS)
                    ),
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
        started = time.time()
        metrics = train(config)
    return {
        **{k: metrics[k] for k in ("accuracy", "macro_f1", "f1_per_class", "confusion_matrix")},
        "recipe": {
            "optimizer": "adamw",
            "lr": args.lr,
            "warmup_ratio": 0.1,
            "class_weights": args.class_weights,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "max_length": args.max_length,
            "bucket_batches": args.bucket_batches,
        },
        "train_seconds": round(time.time() - started, 1),
        "samples_per_sec": metrics.get("samples_per_sec"),
        "samples_seen": metrics.get("samples_seen"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=DATA, default="arabic")
    parser.add_argument(
        "--source", help="labelled review file or folder (required for --data english)"
    )
    parser.add_argument("--finetune", action="store_true", help="also fine-tune the default model")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--class-weights", choices=("none", "balanced"), default="balanced")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--bucket-batches", type=int, default=16)
    parser.add_argument("--out", default="benchmarks/results/quality_baseline.json")
    args = parser.parse_args()
    if args.data == "english" and not args.source:
        parser.error(
            "--data english needs --source PATH: a labelled English review file (not shipped)"
        )
    source = args.source or str(ARABIC)
    started = time.time()

    validated = validate(read_source(SourceSpec(uri=source)), ValidationRules())
    texts = validated.accepted.column("text").to_pylist()
    labels = validated.accepted.column("label").to_pylist()
    split = SplitRule().assign(texts)
    part = {
        s: (
            [t for t, p in zip(texts, split) if p == s],
            [y for y, p in zip(labels, split) if p == s],
        )
        for s in ("train", "test")
    }
    result = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "device": "cpu",
            "load_average_at_start": os.getloadavg(),
        },
        "data": {
            "source": Path(source).name if args.source else "shared/data/arabic_reviews",
            "accepted": validated.accepted.num_rows,
            "rejected": validated.rejected.num_rows,
            "train": len(part["train"][0]),
            "test": len(part["test"][0]),
        },
        "majority": {
            k: v
            for k, v in majority_scores(part["train"][1], part["test"][1], list(LABELS)).items()
            if k in KEEP + ("majority_class",)
        },
    }
    for name, weight in (("baseline_balanced", "balanced"), ("baseline_unweighted", None)):
        t0 = time.time()
        model = BaselineModel.fit(
            *part["train"], BaselineSettings(class_weight=weight), label_set=LABELS
        )
        fit_s = time.time() - t0
        result[name] = {
            **{k: v for k, v in model.evaluate(*part["test"]).items() if k in KEEP},
            "fit_seconds": round(fit_s, 2),
        }
    if args.finetune:
        result["finetuned"] = finetune(validated.accepted, args)
        result["finetuned_minus_baseline_accuracy"] = round(
            result["finetuned"]["accuracy"] - result["baseline_balanced"]["accuracy"], 4
        )
    result["wall_seconds"] = round(time.time() - started, 1)
    out = Path(args.out)
    merged = json.loads(out.read_text()) if out.is_file() else {}
    key = (
        args.data
        if not args.finetune
        else f"{args.data}/finetune_{args.class_weights}_lr{args.lr:g}"
    )
    merged[key] = result
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
