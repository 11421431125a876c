"""A stand-in trainer that commits checkpoints the way the real one does: fenced.

``torchrun ... -m finetune_assets_tests.core.launchers.k8s.gang_standin --config standin:<opts>``,
``<opts>`` a comma list:

- ``train=N``   N steps of ``step_s`` seconds (default 0.2)
- ``dir=PATH``  the checkpoint folder (shared by the plane's pods: local processes); rank 0 raises
                the fence (``finetune_assets.core.training.checkpoints.fencing``) before it reads
                ``PATH/step``,
                then commits the step after each one through the fence, and appends every commit
                (accepted or refused, with its generation) to ``PATH/journal``
- ``nccl=once|always``  fail like a collective that timed out (NCCL's watchdog line, exit 1):
                on the first gang only (a marker file in ``dir``), or every time
- ``term_s=S``  on SIGTERM keep going S seconds before exiting (a trainer that writes a last
                checkpoint when it is stopped, so its pods take that long to terminate)
- ``hold_at=K`` a gang that started before step K stops after it until the test's disruption ends
                it (exit 4 after ``hold_s``, default 120, if none came): a fault aimed mid-run
                cannot miss a gang that finished first
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from finetune_assets.core.training.checkpoints import fencing

# as torch's ProcessGroupNCCL watchdog prints it
NCCL_TIMEOUT = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
    "for 600035 milliseconds before timing out."
)


def journal(folder: Path, line: str) -> None:
    with open(folder / "journal", "a") as f:  # one small append per line: whole lines
        f.write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    config = ap.parse_args(argv).config
    opts = dict(item.partition("=")[::2] for item in config.removeprefix("standin:").split(","))
    rank = int(os.environ.get("RANK", "0"))
    node = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    gen = fencing.generation()
    folder = Path(opts["dir"])
    term_s = float(opts.get("term_s", 0))
    stopping: list[float] = []
    if term_s:
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
    if "nccl" in opts:
        marker = folder / f"nccl-failed-{node}-{rank}"
        if opts["nccl"] == "always" or not marker.exists():
            marker.touch()
            print(NCCL_TIMEOUT.format(rank=rank), file=sys.stderr, flush=True)
            return 1
    if rank == 0:
        fencing.raise_fence(str(folder))
    ckpt = folder / "step"
    start = int(ckpt.read_text()) if ckpt.exists() else 0
    print(f"standin: node={node} rank={rank} generation={gen} resumes at step {start}", flush=True)
    hold_at = int(opts.get("hold_at", 0))
    for step in range(start + 1, int(opts.get("train", 0)) + 1):
        if step == hold_at + 1 and start < hold_at:
            print(f"standin: rank {rank} holds after step {hold_at}", flush=True)
            deadline = time.monotonic() + float(opts.get("hold_s", 120))
            while not stopping and time.monotonic() < deadline:
                time.sleep(0.1)
            if not stopping:
                print(f"standin: rank {rank} held after step {hold_at}: nothing came", flush=True)
                return 4
        time.sleep(float(opts.get("step_s", 0.2)))
        if stopping and time.monotonic() - stopping[0] > term_s:
            print(f"standin: rank {rank} stops after SIGTERM", flush=True)
            return 143
        if rank != 0:
            continue
        try:
            fencing.check_fence(str(folder))
        except fencing.FencedOff as e:
            journal(folder, f"refused generation={gen} step={step}")
            print(f"standin: {e}", file=sys.stderr, flush=True)
            return 1
        tmp = folder / f".step.{os.getpid()}"
        tmp.write_text(str(step))
        tmp.replace(ckpt)
        journal(folder, f"accepted generation={gen} step={step}")
    print(f"standin: trained global_step={opts.get('train', 0)} resumed_at={start}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
