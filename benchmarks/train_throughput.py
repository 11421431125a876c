"""Training throughput: this project's dynamic padding vs the seed's pad-to-512, and loader vs step
rate.

Same model (the packaged all-MiniLM-L6-v2), same data (real reviews from shared/data/arabic_reviews,
tokenized with its tokenizer, written as MDS with the ``mds_shards`` schema), same machine, same
batch size, same optimizer (the seed's Adadelta), the trainer's own train loader. Only the batching
differs: pad every sequence to 512 (seed), pad each batch to its longest (default), or also bucket
by length (``--bucket-batches`` windows). Run (about 5 minutes on 2 CPU cores):

    python benchmarks/train_throughput.py [--steps 10] [--padded-steps 3] [--bucket-batches 16]

``--sample-recipes NAME[,NAME]`` instead trains whole runs, as the README's main command does, on
the offline ``builtin:sample`` data (torchrun, one process, OMP threads = cores, like the local
launcher) for each named recipe in ``RECIPES``, and records wall time, where it went, and test
quality under ``sample_recipes`` in the same results file (the throughput part is kept):

    python benchmarks/train_throughput.py --sample-recipes seed_adadelta,adamw_5e-5,adamw_1e-4
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
from transformers import AutoTokenizer

from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.prep.pretrained import packaged_model_dir
from finetune_assets.core.training.data.collate import DynamicPaddingCollator
from finetune_assets.core.training.data.shard_cache import clean_stale_streaming_memory
from finetune_assets.core.training.data.streaming_loader import ResumableStreamingDataLoader
from finetune_assets.core.training.module import load_classifier

REVIEWS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "arabic_reviews"
if not REVIEWS.exists():
    REVIEWS = Path("/work/shared/data/arabic_reviews")
POLARITY = {"1": 0, "-1": 1, "0": 2}
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # finetune_assets_tests.data_path


def write_shards(out: Path, tokenizer, n: int) -> dict[str, float]:
    texts, labels = [], []
    for name in ("PROD.csv", "ATT.csv", "RES2.csv"):
        with open(REVIEWS / name, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                label = POLARITY.get((row.get("polarity") or "").strip())
                if label is not None and (row.get("text") or "").strip():
                    texts.append(row["text"].strip())
                    labels.append(label)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(texts))[:n]
    ids = tokenizer([texts[i] for i in order], truncation=True, max_length=512)["input_ids"]
    with MDSWriter(
        out=str(out), columns={"input_ids": "ndarray:uint16", "label": "int8"}, compression="zstd"
    ) as w:
        for seq, i in zip(ids, order):
            w.write({"input_ids": np.asarray(seq, dtype=np.uint16), "label": labels[i]})
    lengths = np.array([len(s) for s in ids])
    return {
        "samples": int(n),
        "mean_tokens": float(lengths.mean()),
        "p95_tokens": float(np.percentile(lengths, 95)),
        "max_tokens": int(lengths.max()),
    }


def loader(
    mds: Path, collate, batch_size: int, num_workers: int, bucket: int = 1
) -> StreamingDataLoader:
    """The trainer's own train loader (windows, optional length bucketing)."""
    ds = StreamingDataset(
        local=str(mds),
        batch_size=batch_size * bucket,
        shuffle=True,
        shuffle_seed=1,
        num_canonical_nodes=1,
    )
    return ResumableStreamingDataLoader(
        ds,
        batch_size=batch_size,
        collate_fn=collate,
        epoch_fn=lambda: 0,
        world_size=1,
        bucket_batches=bucket,
        seed=1,
        num_workers=num_workers,
    )


def train_rate(
    mds: Path, collate, batch_size: int, steps: int, warmup: int = 2, bucket: int = 1
) -> dict[str, float]:
    """Forward + backward + Adadelta step, timed after ``warmup`` steps; data loading included."""
    torch.manual_seed(0)
    model = load_classifier(str(packaged_model_dir())).train()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    samples = tokens = 0
    t0 = None
    it = iter(loader(mds, collate, batch_size, num_workers=0, bucket=bucket))
    for step in range(warmup + steps):
        if step == warmup:
            t0 = time.perf_counter()
            samples = tokens = 0
        batch = next(it)
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
        )
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        samples += int(batch["labels"].shape[0])
        tokens += int(batch["num_tokens"])
    seconds = time.perf_counter() - t0
    return {
        "steps": steps,
        "seconds": seconds,
        "samples_per_sec": samples / seconds,
        "tokens_per_sec": tokens / seconds,
        "steps_per_sec": steps / seconds,
    }


def loader_rate(
    mds: Path, collate, batch_size: int, num_workers: int, batches: int, bucket: int = 1
) -> dict[str, float]:
    dl = loader(mds, collate, batch_size, num_workers, bucket)
    it = iter(dl)
    next(it)  # start-up (workers, shard open) is not throughput
    t0 = time.perf_counter()
    samples = 0
    for _ in range(batches):
        batch = next(it, None)
        if batch is None:
            break
        samples += int(batch["labels"].shape[0])
    seconds = time.perf_counter() - t0
    return {"num_workers": num_workers, "batches": batches, "samples_per_sec": samples / seconds}


# Whole-run recipes on builtin:sample: overrides of the trainer's defaults.
SEED = {"optimizer": "adadelta", "lr": 1.0, "gamma": 0.7, "warmup_ratio": 0.0}
RECIPES: dict[str, dict] = {
    "seed_adadelta": {**SEED, "num_workers": 2},
    "seed_adadelta_workers0": {**SEED, "num_workers": 0},
    "adamw_5e-5": {"optimizer": "adamw", "lr": 5e-5, "warmup_ratio": 0.1, "num_workers": 0},
    "adamw_1e-4": {"optimizer": "adamw", "lr": 1e-4, "warmup_ratio": 0.1, "num_workers": 0},
    "adamw_1e-4_workers2": {
        "optimizer": "adamw",
        "lr": 1e-4,
        "warmup_ratio": 0.1,
        "num_workers": 2,
    },
    "adamw_1e-4_balanced": {
        "optimizer": "adamw",
        "lr": 1e-4,
        "warmup_ratio": 0.1,
        "class_weights": "balanced",
        "num_workers": 0,
    },
}


def sample_shards(root: Path) -> dict[str, int]:
    """``builtin:sample`` through the same functions as raw_reviews, then the slice path of
    tokenized_reviews -> mds_shards (``finetune_assets_tests/data_path.py``) into ``root/shards``.
    """
    from collections import Counter

    import pyarrow as pa

    from finetune_assets.core.prep.validate import ValidationRules, validate
    from finetune_assets.core.sources import SourceSpec, read_source
    from finetune_assets_tests.data_path import prepare

    validated = validate(read_source(SourceSpec(uri="builtin:sample")), ValidationRules())
    tokenized, _ = prepare(validated.accepted, packaged_model_dir(), root, 512)
    table = tokenized.table(columns=["length", "split"])
    lengths = table.column("length").to_pylist()
    return {
        **Counter(table.column("split").cast(pa.string()).to_pylist()),
        "mean_tokens": float(np.mean(lengths)),
    }


def run_recipe(root: Path, name: str, model_dir: Path) -> dict:
    from finetune_assets.core.training.config import TrainerConfig

    run = root / name
    cfg = {
        "model_dir": str(model_dir),
        "output_dir": str(run / "out"),
        "checkpoint_dir": str(run / "ckpt"),
        "accelerator": "cpu",
        "data": {
            **{f"{s}_url": str(root / "shards" / s) for s in ("train", "validation", "test")},
            "train_label_counts": read_split_stats(str(root / "shards" / "train")).counts(3),
        },
        "mlflow": {
            "tracking_uri": f"sqlite:///{root}/mlflow.db",
            "artifact_location": str(root / "mlartifacts"),
            "registered_model_name": "bench",
        },
    }
    cfg.update(RECIPES[name])
    config = TrainerConfig.from_dict(cfg)  # the trainer's defaults fill in everything else
    run.mkdir(parents=True)
    (run / "config.json").write_text(config.to_json())
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "1",
            "-m",
            "finetune_assets.core.training",
            "--config",
            str(run / "config.json"),
        ],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    m = json.loads((run / "out" / "metrics.json").read_text())
    return {
        "recipe": RECIPES[name],
        "hyper_parameters": config.hyper_parameters(),
        "epochs": config.epochs,
        "batch_size": config.batch_size,
        "num_workers": config.num_workers,
        "class_weights": config.class_weights,
        "checkpoint_every_n_steps": config.checkpoint_every_n_steps,
        "wall_seconds_torchrun": round(wall, 1),
        "phases_seconds": {k: round(v, 1) for k, v in m["timings"].items()},
        "train_seconds": round(m["train_seconds"], 1),
        "samples_per_sec": round(m["samples_per_sec"], 1),
        "global_step": m["global_step"],
        "checkpoint_mb": round((run / "ckpt" / "last.ckpt").stat().st_size / 2**20, 1),
        "test": {
            "accuracy": round(m["accuracy"], 4),
            "macro_f1": round(m["macro_f1"], 4),
            "f1_per_class": {k: round(v, 4) for k, v in m["f1_per_class"].items()},
            "confusion_matrix": m["confusion_matrix"],
        },
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def sample_recipes(names: list[str], out: Path) -> None:
    from finetune_assets.core.prep.pretrained import DEFAULT_MODEL, save_pretrained_model

    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise SystemExit(f"unknown recipe(s) {unknown}; known: {sorted(RECIPES)}")
    previous = json.loads(out.read_text()) if out.exists() else {}
    section = previous.get("sample_recipes", {})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save_pretrained_model(DEFAULT_MODEL, None, root / "model")
        section["data"] = {"source": "builtin:sample", **sample_shards(root)}
        section["machine"] = {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "device": "cpu",
        }
        section["date"] = time.strftime("%Y-%m-%d")
        runs = section.setdefault("runs", {})
        for name in names:
            runs[name] = run_recipe(root, name, root / "model")
            print(name, json.dumps(runs[name]), flush=True)
            out.write_text(json.dumps({**previous, "sample_recipes": section}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps with dynamic padding")
    parser.add_argument(
        "--padded-steps", type=int, default=3, help="timed steps padded to 512 (slow)"
    )
    parser.add_argument(
        "--bucket-batches", type=int, default=16, help="length-bucketing window, in batches"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--out", default="benchmarks/results/train_throughput.json")
    parser.add_argument(
        "--sample-recipes",
        default=None,
        help="comma-separated RECIPES names: whole runs on builtin:sample",
    )
    args = parser.parse_args()
    if args.sample_recipes:
        sample_recipes(args.sample_recipes.split(","), Path(args.out))
        return

    torch.set_num_threads(os.cpu_count() or 1)
    clean_stale_streaming_memory()
    tokenizer = AutoTokenizer.from_pretrained(packaged_model_dir())
    with tempfile.TemporaryDirectory() as tmp:
        mds = Path(tmp) / "train"
        data = write_shards(mds, tokenizer, args.samples)
        dynamic = DynamicPaddingCollator(tokenizer.pad_token_id)
        padded = DynamicPaddingCollator(tokenizer.pad_token_id, pad_to=512)
        pad = train_rate(mds, padded, args.batch_size, args.padded_steps, warmup=1)
        dyn = train_rate(mds, dynamic, args.batch_size, args.steps)
        bucketed = train_rate(mds, dynamic, args.batch_size, args.steps, bucket=args.bucket_batches)
        loaders = [loader_rate(mds, dynamic, args.batch_size, w, 200) for w in (0, 2)]
        loaders.append(
            {
                **loader_rate(mds, dynamic, args.batch_size, 0, 200, bucket=args.bucket_batches),
                "bucket_batches": args.bucket_batches,
            }
        )
    best_loader = max(r["samples_per_sec"] for r in loaders)
    result = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "device": "cpu",
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "model": "packaged all-MiniLM-L6-v2 (BertForSequenceClassification, 3 labels)",
        "data": {"source": "shared/data/arabic_reviews (PROD, ATT, RES2)", **data},
        "batch_size": args.batch_size,
        "optimizer": "Adadelta lr 1.0 (seed)",
        "pad_to_512_seed": pad,
        "dynamic_padding": dyn,
        "dynamic_padding_with_length_bucketing": {
            **bucketed,
            "bucket_batches": args.bucket_batches,
        },
        "speedup_samples_per_sec": {
            "dynamic_vs_pad512": dyn["samples_per_sec"] / pad["samples_per_sec"],
            "bucketed_vs_pad512": bucketed["samples_per_sec"] / pad["samples_per_sec"],
        },
        "loader_alone": loaders,
        "loader_vs_training_samples_rate": best_loader
        / max(dyn["samples_per_sec"], bucketed["samples_per_sec"]),
        "load_average_1min_at_end": os.getloadavg()[0],
        "targets": {"speedup_min": 3.0, "loader_vs_training_min": 10.0},
    }
    result["targets_met"] = (
        max(result["speedup_samples_per_sec"].values()) >= 3.0
        and result["loader_vs_training_samples_rate"] >= 10.0
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if "sample_recipes" in previous:  # measured separately (--sample-recipes); kept
        result["sample_recipes"] = previous["sample_recipes"]
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
