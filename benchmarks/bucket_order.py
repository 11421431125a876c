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

Padding (``--padding-only``, or with the timed runs unless ``--no-padding``): each rank's batch
widths in training order, replayed from the trainer's own loader (rank 0 and 1 as two one-process
nodes of one process group); a step costs the wider of the two ranks' batches. It failed on its
first try (rank 1 of the replay crashed) and was not re-run: no padding numbers are recorded.

    nice -n 10 python benchmarks/bucket_order.py [--steps 60]   # results/bucket_order.json
    nice -n 10 python benchmarks/bucket_order.py --steps 30 --no-padding   # the recorded run
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
RESULTS = REPO / "benchmarks" / "results" / "bucket_order.json"
ORDERS = ("per_rank", "shared")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def prepare(root: Path) -> None:
    import pyarrow as pa  # noqa: F401
    from defaults import REVIEWS
    from transformers import AutoTokenizer

    from finetune_assets.data.models import DEFAULT_MODEL, packaged_model_dir, save_pretrained_model
    from finetune_assets.data.shards import write_splits
    from finetune_assets.data.sources import SourceSpec, read_source
    from finetune_assets.data.tokenize import tokenize_table
    from finetune_assets.data.validate import ValidationRules, validate

    save_pretrained_model(DEFAULT_MODEL, None, root / "model")
    validated = validate(read_source(SourceSpec(uri=str(REVIEWS))), ValidationRules())
    write_splits(
        tokenize_table(
            validated.accepted, AutoTokenizer.from_pretrained(packaged_model_dir()), 512
        ),
        root / "shards",
    )


def config(root: Path, order: str, steps: int) -> Path:
    from finetune_assets.contracts import read_split_stats
    from finetune_assets.training.config import TrainerConfig

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
    from finetune_assets.launchers.base import torchrun_command

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


def replay(cfg: Path, rank: int, steps: int) -> list[tuple[int, int]]:
    """(batch size, width) of ``rank``'s first ``steps`` training batches, from the trainer's
    loader.
    """
    from types import SimpleNamespace

    from finetune_assets.training.config import TrainerConfig
    from finetune_assets.training.datamodule import MdsDataModule

    c = TrainerConfig.from_json(str(cfg))
    dm = MdsDataModule(c, run_key=f"{cfg}/{rank}")
    dm.trainer = SimpleNamespace(
        global_rank=rank,
        world_size=2,
        num_nodes=2,
        current_epoch=0,
        strategy=SimpleNamespace(barrier=lambda *a: None),
        training=False,
    )
    dm.setup("fit")
    out = []
    for batch in dm.train_dataloader():
        out.append(tuple(batch["input_ids"].shape))
        if len(out) == steps:
            break
    dm.remove_cache()
    return out


def padding(cfg: Path, steps: int) -> dict:
    procs = []
    for rank in (
        0,
        1,
    ):  # two one-process "nodes" in one process group: each is its node's local leader
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29631",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--replay", str(cfg), str(rank), str(steps)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
        )
    widths = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode:
            raise RuntimeError(err[-3000:])
        widths.append(json.loads(out.strip().splitlines()[-1]))
    both = list(zip(*widths))
    lockstep = sum(2 * max(b0 * t0, b1 * t1) for (b0, t0), (b1, t1) in both)
    own = sum(b * t for rank in widths for b, t in rank)
    return {
        "steps": len(both),
        "padded_tokens_lockstep": lockstep,
        "padded_tokens_own": own,
        "steps_with_equal_width": sum(1 for (_, t0), (_, t1) in both if t0 == t1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument(
        "--padding-only", action="store_true", help="only the loader replay (no training)"
    )
    parser.add_argument(
        "--no-padding", action="store_true", help="only the timed runs (no loader replay)"
    )
    parser.add_argument("--replay", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        print(json.dumps(replay(Path(args.replay[0]), int(args.replay[1]), int(args.replay[2]))))
        return
    result: dict = {
        "command": " ".join(["nice -n 10 python", *sys.argv]),
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
        for order in ORDERS:
            cfg = config(root, order, args.steps)
            timed = {} if args.padding_only else train(cfg)
            result["runs"][order] = {
                **timed,
                **({} if args.no_padding else {"padding": padding(cfg, args.steps)}),
            }
            print(order, json.dumps(result["runs"][order]), flush=True)
    per, shared = result["runs"]["per_rank"], result["runs"]["shared"]
    result["shared_vs_per_rank"] = {}
    if not args.no_padding:
        result["shared_vs_per_rank"]["lockstep_padded_tokens_ratio"] = round(
            shared["padding"]["padded_tokens_lockstep"] / per["padding"]["padded_tokens_lockstep"],
            3,
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
