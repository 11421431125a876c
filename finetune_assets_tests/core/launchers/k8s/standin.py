"""A stand-in for ``finetune_assets.core.training``: a torchrun worker whose behaviour the config
selects.

Run as ``torchrun ... -m finetune_assets_tests.core.launchers.k8s.standin --config standin:<opts>``;
``<opts>`` is a comma list (so the same tests run on a real cluster, where no local file reaches the
pods):

- ``ok``                 print who we are and exit 0 (no process group)
- ``allreduce``          ``init_process_group("gloo")``, all_reduce(rank + 1), print the sum
- ``fail-node=I``        the worker on pod index I prints an error and exits 3; the others hang
- ``sleep=S``            sleep S seconds (a hung trainer)
- ``selfkill-node=I``    on the first attempt the worker on pod I SIGKILLs itself (torchrun
                         restarts)
- ``killagent-node=I``   the worker on pod I SIGKILLs its torchrun agent (the pod's main process)
- ``env=NAME``           print a sha256 prefix of $NAME (proves delivery without printing the value)
- ``train=N,ckpt=PATH``  N steps of ``step_s`` (default 0.3) seconds; rank 0 checkpoints the step
                         count to PATH (a shared file) after each; a new run resumes from it
- ``hold_at=K``          with ``train``: a run that started before step K stops there until the
                         test's disruption ends it (exit 4 after ``hold_s``, default 90, if none
                         came), so a fault aimed "mid-run" cannot miss a run that finished first;
                         with ``release=PATH`` it trains on once PATH exists (faults the gang must
                         live through)
- ``lines=N``            print N numbered lines, a few per second (log streaming)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time
from pathlib import Path


def parse(config: str) -> dict[str, str]:
    if not config.startswith("standin:"):
        raise SystemExit(f"standin: unexpected config {config!r}")
    opts = {}
    for item in filter(None, config[len("standin:") :].split(",")):
        key, _, value = item.partition("=")
        opts[key] = value
    return opts


def _held(opts: dict[str, str], node: int) -> bool:
    """Wait at ``hold_at`` for the test: True once ``release`` exists, False when ``hold_s`` ran
    out (the disruption the test aimed here never came).
    """
    release = Path(opts["release"]) if "release" in opts else None
    print(f"standin: node={node} holds at step {opts['hold_at']}", flush=True)
    deadline = time.monotonic() + float(opts.get("hold_s", 90))
    while time.monotonic() < deadline:
        if release is not None and release.exists():
            print(f"standin: node={node} released", flush=True)
            return True
        time.sleep(0.1)
    print(f"standin: node={node} held at step {opts['hold_at']}: nothing came", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    opts = parse(ap.parse_args(argv).config)
    node = int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(
        f"standin: node={node} rank={rank} world={world} attempt={attempt} "
        f"host={os.environ.get('HOSTNAME')}",
        flush=True,
    )

    if "env" in opts:
        value = os.environ.get(opts["env"], "")
        print(
            f"standin: {opts['env']} sha256={hashlib.sha256(value.encode()).hexdigest()[:12]} "
            f"set={bool(value)}",
            flush=True,
        )
    if opts.get("fail-node") == str(node):
        print(
            f"standin: node {node} fails on purpose: RuntimeError('boom on node {node}')",
            file=sys.stderr,
            flush=True,
        )
        return 3
    if "fail-node" in opts:
        time.sleep(600)  # a peer that would hang forever without fail-fast
    if opts.get("selfkill-node") == str(node) and attempt == 0:
        print(f"standin: node {node} worker SIGKILLs itself", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if opts.get("killagent-node") == str(node):
        print(f"standin: node {node} SIGKILLs its torchrun agent", flush=True)
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(600)
    if "killagent-node" in opts:
        time.sleep(600)
    if "sleep" in opts:
        print("standin: sleeping", flush=True)
        time.sleep(float(opts["sleep"]))
    if "lines" in opts:
        for i in range(int(opts["lines"])):
            print(f"standin: line {i}", flush=True)
            time.sleep(0.05)
    if "train" in opts:
        total, ckpt = int(opts["train"]), Path(opts["ckpt"])
        start = int(ckpt.read_text()) if ckpt.exists() else 0
        print(f"standin: node={node} resumes at step {start}", flush=True)
        for step in range(start + 1, total + 1):
            time.sleep(float(opts.get("step_s", 0.3)))
            if rank == 0:
                tmp = ckpt.with_suffix(".tmp")
                tmp.write_text(str(step))
                tmp.replace(ckpt)
            print(f"standin: node={node} step {step}", flush=True)
            if step == int(opts.get("hold_at", 0)) and start < step and not _held(opts, node):
                return 4
        print(f"standin: trained global_step={total} resumed_at={start}", flush=True)
    if "allreduce" in opts:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        print(f"standin: allreduce={t.item():g} world={dist.get_world_size()}", flush=True)
        dist.barrier()
        dist.destroy_process_group()
    print(f"standin: node={node} rank={rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
