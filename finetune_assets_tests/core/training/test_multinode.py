"""Two nodes on one machine (``torchrun --nnodes 2`` with c10d rendezvous on localhost, gloo), on
uneven data.

One run carries the checks a 2-node job depends on: each node caches about half the train shards
(its own cache folder); every train sample is trained, and every test sample evaluated, exactly
once although no split divides evenly; class weights equal a single-process run's; and a node
whose workers are restarted by its agent while the other node's agent restarts its own for the
membership change (restart counts 1 and 0) meets again, and the run completes. Checkpoints written
at one world size are refused, clearly, at another (2 -> 1 and 1 -> 2).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.launchers.base import torchrun_command
from finetune_assets.core.training.checkpoints.layout import WorldSizeChanged
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.data.shard_cache import read_index
from finetune_assets.core.training.run import train
from finetune_assets_tests.core.training.fixtures import write_split
from finetune_assets_tests.core.training.test_faults import _workers
from finetune_assets_tests.processes import kill_tree

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]
SIZES = {"train": 101, "validation": 13, "test": 25}  # none divides by 2 ranks x batch 4


def _label(i: int) -> int:
    return 2 if i % 5 == 0 else 1 if i % 3 == 0 else 0  # skewed: weights differ per class


def write_shards(root: Path) -> Path:
    start = 0
    for split, n in SIZES.items():
        ids = [[101, 1000 + start + i, *range(2000, 2000 + (i * 7) % 40), 102] for i in range(n)]
        # ~20 shards
        write_split(root / split, ids, [_label(start + i) for i in range(n)], size_limit=1 << 9)
        start += n
    return root


def config(root: Path, name: str, model: Path, shards: Path, **overrides) -> Path:
    cfg = {
        "model_dir": str(model),
        "output_dir": str(root / "out"),
        "checkpoint_dir": str(root / "ckpt"),
        "accelerator": "cpu",
        "epochs": 1,
        "checkpoint_every_n_steps": 3,
        "log_every_n_steps": 2,
        "batch_size": 4,
        "data": {
            "train_url": str(shards / "train"),
            "train_label_counts": read_split_stats(str(shards / "train")).counts(3),
            "validation_url": str(shards / "validation"),
            "test_url": str(shards / "test"),
        },
        "mlflow": {
            "tracking_uri": f"sqlite:///{root}/mlflow.db",
            "artifact_location": str(root / "mlartifacts"),
            "log_model": False,
        },
        **overrides,
    }
    path = root / f"{name}.json"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _node(cfg: Path, rank: int, port: int, log: Path, cache: Path) -> subprocess.Popen:
    """One node's torchrun agent, with its own cache volume (``XDG_CACHE_HOME``, as the pods
    have).
    """
    cmd = torchrun_command(
        str(cfg),
        nproc_per_node=1,
        nnodes=2,
        node_rank=str(rank),
        max_restarts=1,
        rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_id="two-nodes",
        python=sys.executable,
    )
    with open(log, "a") as out:
        return subprocess.Popen(
            cmd,
            cwd=REPO,
            env={**_env(), "XDG_CACHE_HOME": str(cache)},
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _restart_counts(log: Path) -> set[str]:
    """The TORCHELASTIC_RESTART_COUNT values a node's workers were started with (the trainer logs
    them).
    """
    return set(re.findall(r"restart count (\d+)", log.read_text()))


def test_two_nodes_cache_half_each_sample_once_and_unequal_restart_counts_meet(
    tmp_path, _tiny_model_session
):
    model, shards = _tiny_model_session, write_shards(tmp_path / "shards")

    # 1. one process, stopped mid-epoch: the reference class weights, and a world-size-1 checkpoint
    single_cfg = config(tmp_path / "single", "run", model, shards, max_steps=5)
    single = train(TrainerConfig.from_json(str(single_cfg)))
    assert sum(map(sum, single["confusion_matrix"])) == SIZES["test"]

    # 2. two nodes. Once a checkpoint exists, node 0's worker is frozen and node 1's killed: node
    #    1's
    # agent restarts its worker (restart count 1), node 0's agent restarts its healthy-looking one
    # for the membership change (restart count stays 0). Their workers must still meet.
    run = tmp_path / "two"
    cfg = config(run, "run", model, shards)
    logs = [run / "node0.log", run / "node1.log"]
    port = _free_port()
    nodes = [_node(cfg, i, port, logs[i], cache=run / f"node{i}-cache") for i in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        while (
            not (run / "ckpt" / "last.ckpt").exists()
            and time.monotonic() < deadline
            and nodes[0].poll() is None
        ):
            time.sleep(0.05)
        mid_epoch = tmp_path / "mid-epoch.ckpt"
        shutil.copy(run / "ckpt" / "last.ckpt", mid_epoch)
        frozen, killed = _workers(nodes[0].pid)[0], _workers(nodes[1].pid)[1]
        os.kill(frozen, signal.SIGSTOP)
        os.kill(killed, signal.SIGKILL)
        codes = [p.wait(timeout=400) for p in nodes]
    finally:
        for p in nodes:
            kill_tree(p.pid, signal.SIGKILL)
    restarts = [_restart_counts(log) for log in logs]
    assert codes == [0, 0], "\n".join(log.read_text()[-4000:] for log in logs)
    metrics = json.loads((run / "out" / "metrics.json").read_text())
    # the restarted group resumed
    assert metrics["world_size"] == 2 and metrics["resumed_at_step"] > 0
    # the case that hung: workers with unequal restart counts
    assert restarts[0] != restarts[1], restarts

    # each train sample trained once, each test sample evaluated once, weights as in one process
    assert metrics["samples_seen"] == SIZES["train"]
    assert sum(map(sum, metrics["confusion_matrix"])) == SIZES["test"]
    assert metrics["class_weights"] == pytest.approx(single["class_weights"])

    # each node cached (about) its half of the train shards, in its own cache volume, removed after
    # success
    shards_total = len(read_index(str(shards / "train"), "train")["shards"])
    per_node = metrics["train_shards_cached_per_node"]
    assert len(per_node) == 2 and shards_total >= 8, (per_node, shards_total)
    for cached in per_node:
        assert shards_total / 2 - 2 <= cached <= shards_total / 2 + 2, (per_node, shards_total)
    assert not list(run.glob("node*-cache/finetune_assets/mds-cache/*"))

    # 3. a world-size change is refused with the way out, in both directions
    back = tmp_path / "two-to-one"
    (back / "ckpt").mkdir(parents=True)
    shutil.copy(mid_epoch, back / "ckpt" / "last.ckpt")
    with pytest.raises(WorldSizeChanged, match="written by 2 training processes, this run has 1"):
        train(TrainerConfig.from_json(str(config(back, "run", model, shards))))
    cmd = torchrun_command(str(single_cfg), nproc_per_node=2, python=sys.executable)
    up = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert up.returncode != 0
    assert "written by 1 training processes, this run has 2" in up.stdout + up.stderr


def test_fsdp2_hsdp_across_two_nodes_of_two_in_bf16_fits_tests_and_exports(
    tmp_path, _tiny_model_session
):
    """``strategy: fsdp`` on 4 processes as 2 "nodes" x 2 (gloo): the real (2, 2) mesh, sharded
    within a node and replicated across nodes (HSDP); bf16 all-gathers with fp32 gradient
    reduction (``MixedPrecisionPolicy``); no gradient sync inside accumulation; fit -> test ->
    export.
    """
    from safetensors import safe_open

    model, shards = _tiny_model_session, write_shards(tmp_path / "shards")
    run = tmp_path / "hsdp"
    cfg = config(
        run,
        "run",
        model,
        shards,
        strategy="fsdp",
        precision="bf16-mixed",
        accumulate_grad_batches=2,
        max_steps=4,
        checkpoint_every_n_steps=100,
        limit_val_batches=1,
    )
    logs = [run / "node0.log", run / "node1.log"]
    port = _free_port()
    nodes = []
    for rank in (0, 1):
        cmd = torchrun_command(
            str(cfg),
            nproc_per_node=2,
            nnodes=2,
            node_rank=str(rank),
            rdzv_endpoint=f"127.0.0.1:{port}",
            rdzv_id="hsdp",
            python=sys.executable,
        )
        with open(logs[rank], "a") as out:
            nodes.append(
                subprocess.Popen(
                    cmd,
                    cwd=REPO,
                    env={**_env(), "XDG_CACHE_HOME": str(run / f"node{rank}-cache")},
                    start_new_session=True,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        codes = [p.wait(timeout=600) for p in nodes]
    finally:
        for p in nodes:
            kill_tree(p.pid, signal.SIGKILL)
    text = logs[0].read_text()
    assert codes == [0, 0], "\n".join(log.read_text()[-4000:] for log in logs)
    assert (
        "FSDP2 on mesh (2, 2), mixed precision param torch.bfloat16, reduce torch.float32" in text
    )
    metrics = json.loads((run / "out" / "metrics.json").read_text())
    assert metrics["world_size"] == 4 and metrics["global_step"] == 4
    # one reduce-scatter per optimizer step; the window's other micro-batch accumulates without
    # (7 micro-batches per rank: 2 ranks' 101 / 4 / batch 4, the last one steps alone)
    reduced, unsynced = map(
        int,
        re.search(
            r"FSDP2 gradient sync: (\d+) micro-batches reduced, (\d+) accumulated", text
        ).groups(),
    )
    assert reduced == metrics["global_step"] and unsynced == 3
    assert sum(map(sum, metrics["confusion_matrix"])) == SIZES["test"]  # tested on all 4 ranks
    # sharded over a node's 2 ranks (about half the model each), replicated across the 2 nodes
    held = metrics["parameters_per_rank"]
    assert len(held) == 4 and held[0] == held[2] and held[1] == held[3]
    assert max(held) < 0.6 * sum(held[:2])
    with safe_open(str(run / "out" / "model" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}  # fp32 master weights
