"""Ranks in step: 2-process DDP step time on CPU, length-bucket order shared by all ranks or not.

With length bucketing each rank runs a window of batches sorted by length. Per-rank order (before):
each rank shuffles its batches with its own seed, so at one step the ranks run different lengths
and the gradient all-reduce waits for the longest. Shared order (now, ``data.bucket_order:
shared``): every rank runs its k-th shortest batch at the same step.

Same data (real reviews, the packaged all-MiniLM-L6-v2 and its tokenizer, as the assets write
them), same config but ``data.bucket_order``; each run is the trainer under ``torchrun
--nproc-per-node 2`` (gloo, one thread per process), ``--steps`` optimizer steps, batch 8,
``bucket_batches`` 16, fp32. Step time is the trainer's steady-state window (no start-up,
validation or checkpoint saves).

Padding (with the timed runs unless ``--no-padding``; ``--padding-only`` alone takes seconds):
the pad tokens of one whole epoch of the same train split, per rank and in lockstep (each step
costs every rank the widest rank's batch), computed with the trainer's own windowing code
(:func:`padding`); the split of samples between ranks is a seeded stand-in for streaming's.

    nice -n 19 python benchmarks/bucket_order.py --steps 30   # results/bucket_order.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))  # finetune_assets_tests.data_path
RESULTS = REPO / "benchmarks" / "results" / "bucket_order.json"
ORDERS = ("per_rank", "shared")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def prepare(root: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    from defaults import REVIEWS

    from finetune_assets.core.prep.pretrained import (
        DEFAULT_MODEL,
        packaged_model_dir,
        save_pretrained_model,
    )
    from finetune_assets.core.prep.validate import ValidationRules, validate
    from finetune_assets.core.sources import SourceSpec, read_source
    from finetune_assets_tests.data_path import prepare as tokenize_and_shard

    save_pretrained_model(DEFAULT_MODEL, None, root / "model")
    validated = validate(read_source(SourceSpec(uri=str(REVIEWS))), ValidationRules())
    tokenized, _ = tokenize_and_shard(validated.accepted, packaged_model_dir(), root, 512)
    table = tokenized.table(columns=["length", "split"])
    train = table.filter(pc.equal(table.column("split").cast(pa.string()), "train"))
    lengths = train.column("length").to_pylist()
    (root / "train_lengths.json").write_text(json.dumps(lengths))


def config(root: Path, order: str, steps: int) -> Path:
    from finetune_assets.core.io.contracts import read_split_stats
    from finetune_assets.core.training.config import TrainerConfig

    run = root / order
    run.mkdir(parents=True, exist_ok=True)
    c = TrainerConfig.from_dict(
        {
            "model_dir": str(root / "model"),
            "output_dir": str(run / "out"),
            "checkpoint_dir": str(run / "ckpt"),
            "accelerator": "cpu",
            "max_steps": steps,
            "precision": "32",
            "batch_size": 8,
            "bucket_batches": 16,
            "checkpoint_every_n_steps": 100_000,
            "log_every_n_steps": 10,
            "limit_val_batches": 1,
            "limit_test_batches": 1,
            "data": {
                **{f"{s}_url": str(root / "shards" / s) for s in ("train", "validation", "test")},
                "train_label_counts": read_split_stats(str(root / "shards" / "train")).counts(3),
                "bucket_order": order,
            },
            "mlflow": {"tracking_uri": f"sqlite:///{root}/mlflow.db", "log_model": False},
        }
    )
    (run / "config.json").write_text(c.to_json())
    return run / "config.json"


def train(cfg: Path) -> dict:
    from finetune_assets.core.launchers.base import torchrun_command

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    before, t0 = uptime(), time.perf_counter()
    proc = subprocess.run(
        torchrun_command(str(cfg), nproc_per_node=2, python=sys.executable),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    m = json.loads((cfg.parent / "out" / "metrics.json").read_text())
    w = m["throughput"]
    return {
        "steps": m["global_step"],
        "window_batches": w["window_batches"],
        "step_seconds": round(w["window_seconds"] / max(1, w["window_batches"]), 4),
        "samples_per_sec": round(w["samples_per_sec"], 2),
        "tokens_per_sec": round(w["tokens_per_sec"], 1),
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "uptime_before": before,
        "uptime_after": uptime(),
    }


def padding(lengths: list[int], order: str, ranks: int = 2, batch: int = 8, window: int = 16,
            seed: int = 0) -> dict:  # fmt: skip
    """Pad tokens over one epoch when ranks step in lockstep, through the trainer's own windowing.

    Each rank's stream is a seeded shuffle of the train split dealt round-robin (a stand-in for
    StreamingDataset's partition); its windows of ``window * batch`` samples go through the
    trainer's :class:`WindowCollator` (sort, cut, and for ``per_rank`` its own shuffle) and, for
    ``shared``, :func:`bucket_order`. A step's batch costs each rank the widest rank's tokens
    (``batch x width``: every rank waits for it), so pad = lockstep tokens - real tokens.
    """
    import random

    from finetune_assets.core.training.data.datamodule import WindowCollator, bucket_order

    def shape(rows: list[dict]) -> dict:
        return {
            "labels": rows,
            "width": max(r["n"] for r in rows),
            "real": sum(r["n"] for r in rows),
        }

    stream = list(range(len(lengths)))
    random.Random(seed).shuffle(stream)
    collator = WindowCollator(shape, batch, window, seed, per_rank=order == "per_rank")
    steps_per_rank = []
    for rank in range(ranks):
        mine = [{"n": lengths[i], "input_ids": np.zeros(lengths[i], np.uint16)}
                for i in stream[rank::ranks]]  # fmt: skip
        steps = []
        for number, start in enumerate(range(0, len(mine), window * batch)):
            batches = collator(mine[start : start + window * batch])
            if order == "shared":
                batches = [batches[k] for k in bucket_order(len(batches), seed, 0, number)]
            steps += [(len(b["labels"]), b["width"], b["real"]) for b in batches]
        steps_per_rank.append(steps)
    both = list(zip(*steps_per_rank))
    real = sum(r for step in both for _, _, r in step)
    own = sum(b * t for step in both for b, t, _ in step)
    lockstep = sum(ranks * max(b * t for b, t, _ in step) for step in both)
    return {
        "steps": len(both),
        "real_tokens": real,
        "tokens_padded_per_rank": own,
        "tokens_lockstep": lockstep,
        "pad_fraction_per_rank": round(1 - real / own, 4),
        "pad_fraction_lockstep": round(1 - real / lockstep, 4),
        "steps_with_equal_width": sum(1 for step in both if len({t for _, t, _ in step}) == 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument(
        "--padding-only", action="store_true", help="only the padding (no training)"
    )
    parser.add_argument("--no-padding", action="store_true", help="only the timed runs")
    args = parser.parse_args()
    result: dict = {
        "command": " ".join(["nice -n 19 python", *sys.argv]),
        "uptime_start": uptime(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "setup": "torchrun 2 processes, gloo, OMP 1 thread each, packaged all-MiniLM-L6-v2, fp32, "
        "batch 8, bucket_batches 16, real reviews",
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepare(root)
        lengths = json.loads((root / "train_lengths.json").read_text())
        for order in ORDERS:
            cfg = config(root, order, args.steps)
            timed = {} if args.padding_only else train(cfg)
            result["runs"][order] = {
                **timed,
                **({} if args.no_padding else {"padding": padding(lengths, order)}),
            }
            print(order, json.dumps(result["runs"][order]), flush=True)
    per, shared = result["runs"]["per_rank"], result["runs"]["shared"]
    result["shared_vs_per_rank"] = {}
    if not args.no_padding:
        result["shared_vs_per_rank"]["lockstep_tokens_ratio"] = round(
            shared["padding"]["tokens_lockstep"] / per["padding"]["tokens_lockstep"], 3
        )
    if not args.padding_only:
        result["shared_vs_per_rank"]["step_time_ratio"] = round(
            shared["step_seconds"] / per["step_seconds"], 3
        )
    result["uptime_end"] = uptime()
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
