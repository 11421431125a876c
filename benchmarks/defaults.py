"""The fast defaults, measured on real data: length bucketing x precision for training,
length-sorted predict.

Training: the trainer's defaults (AdamW 5e-5, warmup 10 %, balanced class weights, batch 8, max
length 512) on shared/data/arabic_reviews (PROD + ATT + RES2 through read_source -> validate -> the
tokenize and shard slice workers as the assets run them, ``finetune_assets_tests/data_path.py``),
one CPU process per run (``python -m finetune_assets.core.training``, the command torchrun runs), a
fixed ``--steps`` of training, then the whole test split. The seed's recipe (every sequence padded
to 512, fp32) and today's defaults run first, on the same data in the same process of this script:
``defaults_vs_seed_samples_per_sec`` is the one ratio. Then one change at a time: ``bucket_batches``
(1: off, 16: the default) x ``precision`` (``32``, ``bf16-mixed``; ``auto`` picks bf16 where the CPU
has AVX512-BF16/AMX, and the result says what it resolved to here). samples/s is the trainer's
steady-state window (no start-up, validation or checkpoint saves). Quality after a short fixed
budget (the same test samples for every run: evaluation is not shuffled) is a comparison between the
runs, not the model's final quality.

Predict: the trained default model classifies the test texts with ``--batch-size`` 32, in input
order (the old way) and in length-sorted batches (``finetune_assets.core.evaluation.batching``, what
``predict`` now does), in fp32; labels must agree. Run (about 10 minutes on 2 idle cores; far longer
on a loaded machine):

    nice -n 10 python benchmarks/defaults.py [--steps 30] [--test-batches 16] [--predict-texts 160]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa

from finetune_assets.core.evaluation.batching import predict_in_length_order
from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.prep.pretrained import (
    DEFAULT_MODEL,
    packaged_model_dir,
    save_pretrained_model,
)
from finetune_assets.core.prep.validate import ValidationRules, validate
from finetune_assets.core.sources import SourceSpec, read_source
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.precision import cpu_supports_bf16, resolve_precision

REVIEWS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "arabic_reviews"
if not REVIEWS.exists():
    REVIEWS = Path("/work/shared/data/arabic_reviews")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # finetune_assets_tests.data_path

SEED = "seed_pad512_fp32 (the seed's recipe)"
DEFAULT = "defaults (bucketing 16, precision auto)"
# name -> (bucket_batches, precision, pad_to): the seed and today's defaults first, then one change
# each
RUNS = {
    SEED: (1, "32", 512),
    DEFAULT: (16, "auto", None),
    "dynamic_fp32 (before bucketing)": (1, "32", None),
    "bucketed_fp32": (16, "32", None),
    "dynamic_bf16": (1, "bf16-mixed", None),
}
# The seed padded every sequence to 512; the trainer pads each batch to its longest. This runs the
# same trainer with the data module's benchmark-only ``pad_to`` (no trainer config knob for it).
PADDED_TRAIN = (
    "import functools, sys; from finetune_assets.core.training import run; "
    "from finetune_assets.core.training.config import TrainerConfig; "
    "run.MdsDataModule = functools.partial(run.MdsDataModule, pad_to=int(sys.argv[2])); "
    "run.train(TrainerConfig.from_json(sys.argv[1]))"
)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def train_run(
    root: Path,
    name: str,
    bucket: int,
    precision: str,
    pad_to: int | None,
    steps: int,
    test_batches: int,
) -> dict:
    run = root / name.split()[0]
    config = TrainerConfig.from_dict(
        {
            "model_dir": str(root / "model"),
            "output_dir": str(run / "out"),
            "checkpoint_dir": str(run / "ckpt"),
            "accelerator": "cpu",
            "max_steps": steps,
            "epochs": 1,
            "bucket_batches": bucket,
            "precision": precision,
            "checkpoint_every_n_steps": 100_000,
            "log_every_n_steps": 50,
            "limit_val_batches": 1,
            "limit_test_batches": test_batches,
            "data": {
                **{f"{s}_url": str(root / "shards" / s) for s in ("train", "validation", "test")},
                "train_label_counts": read_split_stats(str(root / "shards" / "train")).counts(3),
            },
            "mlflow": {
                "tracking_uri": f"sqlite:///{root}/mlflow.db",
                "artifact_location": str(root / "mlartifacts"),
                "log_model": False,
            },
        }
    )
    run.mkdir(parents=True)
    (run / "config.json").write_text(config.to_json())
    env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1), "PYTHONUNBUFFERED": "1"}
    before = uptime()
    t0 = time.perf_counter()
    cmd = (
        [
            sys.executable,
            "-m",
            "finetune_assets.core.training",
            "--config",
            str(run / "config.json"),
        ]
        if pad_to is None
        else [sys.executable, "-c", PADDED_TRAIN, str(run / "config.json"), str(pad_to)]
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    m = json.loads((run / "out" / "metrics.json").read_text())
    print(f"{name}: {m['samples_per_sec']:.2f} samples/s, macro-F1 {m['macro_f1']:.4f}", flush=True)
    return {
        "bucket_batches": bucket,
        "pad_to": pad_to,
        "precision": m["precision"],
        "steps": m["global_step"],
        "samples_seen": m["samples_seen"],
        "train_seconds": round(m["train_seconds"], 1),
        "samples_per_sec": round(m["samples_per_sec"], 2),
        "tokens_per_sec": round(m["tokens_per_sec"], 1),
        "steady_state_window": {
            k: m["throughput"][k] for k in ("window_batches", "window_seconds", "excludes")
        },
        "test_seconds": round(m["timings"]["test"], 1),
        "wall_seconds": round(wall, 1),
        "test": {
            "split_samples": m["test_samples"],
            "evaluated_samples": min(8 * test_batches, m["test_samples"]),
            "accuracy": round(m["accuracy"], 4),
            "macro_f1": round(m["macro_f1"], 4),
            "f1_per_class": {k: round(v, 4) for k, v in m["f1_per_class"].items()},
        },
        "uptime_before": before,
        "uptime_after": uptime(),
    }


def predict_rates(model_dir: Path, texts: list[str], batch_size: int) -> dict:
    import torch

    from finetune_assets.core.evaluation.inference import Classifier

    classifier = Classifier.from_folder(model_dir)

    def predict(batch: list[str]) -> list:
        return classifier.predict(batch, 512)

    predict(texts[:batch_size])  # warm-up
    t0 = time.perf_counter()
    in_order = [
        r
        for start in range(0, len(texts), batch_size)
        for r in predict(texts[start : start + batch_size])
    ]
    unsorted_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    by_length = predict_in_length_order(predict, texts, batch_size)
    sorted_s = time.perf_counter() - t0
    return {
        "texts": len(texts),
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "mean_chars": round(sum(map(len, texts)) / len(texts), 1),
        "input_order_texts_per_sec": round(len(texts) / unsorted_s, 2),
        "length_sorted_texts_per_sec": round(len(texts) / sorted_s, 2),
        "speedup": round(unsorted_s / sorted_s, 2),
        "same_labels": [r[0] for r in in_order] == [r[0] for r in by_length],
        "max_score_difference": max(abs(a[1] - b[1]) for a, b in zip(in_order, by_length)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--test-batches", type=int, default=16, help="test batches of 8 (the same samples per run)"
    )
    parser.add_argument("--predict-texts", type=int, default=160)
    parser.add_argument("--predict-batch-size", type=int, default=32)
    parser.add_argument(
        "--predict-only",
        action="store_true",
        help="only the predict part, with the packaged base model (speed does not depend on the "
        "weights), merged into --out",
    )
    parser.add_argument("--out", default="benchmarks/results/defaults.json")
    parser.add_argument(
        "--runs",
        type=int,
        default=len(RUNS),
        help="only the first N runs (2: the seed and the defaults, the one ratio)",
    )
    args = parser.parse_args()
    if args.predict_only:
        predict_only(args)
        return
    started = time.time()
    result: dict = {
        "command": " ".join(["nice -n 19 python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "device": "cpu",
            "cpu_bf16 (avx512_bf16 or amx)": cpu_supports_bf16(),
            "precision_auto_resolves_to": resolve_precision("auto", "auto"),
        },
        "uptime_start": uptime(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        summary = save_pretrained_model(DEFAULT_MODEL, None, root / "model")
        from finetune_assets_tests.data_path import prepare

        validated = validate(read_source(SourceSpec(uri=str(REVIEWS))), ValidationRules())
        tokenized, _ = prepare(validated.accepted, packaged_model_dir(), root, 512)
        table = tokenized.table(columns=["length", "split"])
        split = table.column("split").cast(pa.string()).to_pylist()
        lengths = table.column("length").to_pylist()
        result["model"] = summary.source
        result["data"] = {
            "source": "shared/data/arabic_reviews (PROD, ATT, RES2)",
            "accepted": validated.accepted.num_rows,
            "splits": dict(Counter(split)),
            "mean_tokens": round(sum(lengths) / len(lengths), 1),
            "p95_tokens": sorted(lengths)[int(0.95 * len(lengths))],
        }
        result["training"] = {
            "recipe": "trainer defaults (AdamW 5e-5, warmup 0.1, balanced, batch 8, max length 512)"
            f", {args.steps} steps, then {args.test_batches} test batches",
            "runs": {},
        }
        for name, (bucket, precision, pad_to) in list(RUNS.items())[: args.runs]:
            result["training"]["runs"][name] = train_run(
                root, name, bucket, precision, pad_to, args.steps, args.test_batches
            )
            write(args.out, result)  # partial results survive an interrupted run
        runs = result["training"]["runs"]
        base = runs[SEED]
        result["training"]["defaults_vs_seed_samples_per_sec"] = (
            round(runs[DEFAULT]["samples_per_sec"] / base["samples_per_sec"], 2)
            if DEFAULT in runs
            else None
        )
        result["training"]["vs_seed"] = {
            name: {
                "speedup": round(r["samples_per_sec"] / base["samples_per_sec"], 2),
                "macro_f1_delta": round(r["test"]["macro_f1"] - base["test"]["macro_f1"], 4),
                "accuracy_delta": round(r["test"]["accuracy"] - base["test"]["accuracy"], 4),
            }
            for name, r in runs.items()
        }
        texts_col = validated.accepted.column("text").to_pylist()
        texts = [t for t, s in zip(texts_col, split) if s == "test"][: args.predict_texts]
        result["predict"] = predict_rates(
            root / "defaults" / "out" / "model", texts, args.predict_batch_size
        )
        print(json.dumps(result["predict"]), flush=True)
    result["wall_seconds"] = round(time.time() - started, 1)
    result["uptime_end"] = uptime()
    write(args.out, result)
    print(json.dumps(result, indent=2))


def test_texts(limit: int) -> list[str]:
    """The first ``limit`` texts of the test split, as raw_reviews split them (by the normalized
    text's hash).
    """
    accepted = validate(read_source(SourceSpec(uri=str(REVIEWS))), ValidationRules()).accepted
    split = accepted.column("split").cast(pa.string()).to_pylist()  # tokenization keeps it
    return [t for t, s in zip(accepted.column("text").to_pylist(), split) if s == "test"][:limit]


def predict_only(args: argparse.Namespace) -> None:
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained_model(DEFAULT_MODEL, None, Path(tmp) / "model")
        before = uptime()
        result["predict"] = {
            **predict_rates(
                Path(tmp) / "model", test_texts(args.predict_texts), args.predict_batch_size
            ),
            "model": "packaged base model (untrained head)",
            "command": " ".join(["nice -n 19 python", *sys.argv]),
            "uptime_before": before,
            "uptime_after": uptime(),
        }
    write(args.out, result)
    print(json.dumps(result["predict"], indent=2))


def write(out: str, result: dict) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
