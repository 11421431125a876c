"""Per-step overhead of the checkpoint trigger: Lightning's time trigger (the old default) vs the
trainer's step trigger (``BoundaryCheckpoint``, the new default), in one run on CPU.

Lightning's ``ModelCheckpoint(train_time_interval=...)`` reads the clock and broadcasts rank 0's
decision at every micro-batch end: a collective (on a GPU, a host round trip) per batch. The
trainer's ``BoundaryCheckpoint`` acts only after an optimizer step, and reads a time interval only
every ``log_every_n_steps`` steps. Neither saves during the measurement (the intervals are longer
than the run): what is measured is the trigger alone.

Two ranks (gloo) train a tiny model on random data so that per-step framework cost dominates; each
case runs ``--steps`` optimizer steps, interleaved ``--repeats`` times. Counted exactly: the
trigger's broadcasts per micro-batch. Timed (noisy on a shared machine): seconds per micro-batch.

    .venv/bin/python benchmarks/checkpoint_trigger.py [--steps 300] [--repeats 3]

(it re-runs itself under ``torchrun --nproc-per-node 2``). Output: results/checkpoint_trigger.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "checkpoint_trigger.json"
ACCUMULATE = 4


def _cases(tmp: str):
    from pytorch_lightning.callbacks import ModelCheckpoint

    from finetune_assets.core.training.callbacks import BoundaryCheckpoint

    never = datetime.timedelta(days=1)
    return {
        "none": lambda: [],
        "lightning_time_trigger (old default)": lambda: [
            ModelCheckpoint(dirpath=tmp, train_time_interval=never, save_top_k=0, save_last=True)
        ],
        "boundary_step_trigger (new default)": lambda: [
            BoundaryCheckpoint(dirpath=tmp, every_n_train_steps=500, save_top_k=0, save_last=True)
        ],
        "boundary_time_trigger (opt-in)": lambda: [
            BoundaryCheckpoint(
                dirpath=tmp,
                train_time_interval=never,
                time_check_every_n_steps=10,
                save_top_k=0,
                save_last=True,
            )
        ],
    }


def worker(steps: int, repeats: int) -> None:
    import pytorch_lightning as pl
    import torch

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(16, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            self.t0 = time.perf_counter()

        def on_train_end(self, trainer, pl_module):
            self.seconds = time.perf_counter() - self.t0

    batches = steps * ACCUMULATE
    data = torch.utils.data.TensorDataset(
        torch.randn(batches * 4, 16), torch.randint(0, 2, (batches * 4,))
    )
    rank = int(os.environ["RANK"])
    out: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases = _cases(tmp)
        for _ in range(repeats):
            for name, make in cases.items():
                clock, checkpoint = Clock(), make()
                trainer = pl.Trainer(
                    accelerator="cpu",
                    devices=2,
                    strategy="ddp",
                    max_steps=steps,
                    accumulate_grad_batches=ACCUMULATE,
                    logger=False,
                    enable_progress_bar=False,
                    enable_model_summary=False,
                    enable_checkpointing=bool(checkpoint),
                    callbacks=[clock, *checkpoint],
                )
                calls = {"n": 0}
                broadcast = trainer.strategy.broadcast

                def counted(obj, src=0, _b=broadcast, calls=calls):
                    calls["n"] += 1
                    return _b(obj, src)

                trainer.strategy.broadcast = counted
                loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=False)
                start = calls["n"]
                trainer.fit(Tiny(), loader)
                out.setdefault(name, []).append(
                    {"seconds": clock.seconds, "broadcasts": calls["n"] - start}
                )
    if rank == 0:
        result = {}
        for name, runs in out.items():
            per_batch = [r["seconds"] / batches for r in runs]
            result[name] = {
                "ms_per_micro_batch_median": 1000 * statistics.median(per_batch),
                "ms_per_micro_batch_runs": [round(1000 * v, 4) for v in per_batch],
                # setup broadcasts (Lightning's own, same in every case) included
                "broadcasts_per_micro_batch": runs[-1]["broadcasts"] / batches,
            }
        base = result["none"]["ms_per_micro_batch_median"]
        for r in result.values():
            r["overhead_ms_per_micro_batch"] = r["ms_per_micro_batch_median"] - base
        Path(os.environ["CHECKPOINT_TRIGGER_OUT"]).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args.steps, args.repeats)
        return
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CHECKPOINT_TRIGGER_OUT": str(raw)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", "2", __file__, "--steps", str(args.steps)]
        cmd += ["--repeats", str(args.repeats)]
        subprocess.run(cmd, check=True, env=env)
        cases = json.loads(raw.read_text())
    import torch

    result = {
        "command": f"python benchmarks/checkpoint_trigger.py --steps {args.steps} "
        f"--repeats {args.repeats}",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_1min": os.getloadavg()[0],
            "torch": torch.__version__,
        },
        "ranks": 2,
        "backend": "gloo",
        "accumulate_grad_batches": ACCUMULATE,
        "optimizer_steps": args.steps,
        "micro_batches": args.steps * ACCUMULATE,
        "cases": cases,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
