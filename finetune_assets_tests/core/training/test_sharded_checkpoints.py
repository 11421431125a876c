"""``checkpoint_format: sharded``: FSDP2 writes DCP folders (each rank its shards), resumable at
another world size from an epoch's end, through ``torchrun`` on CPU (gloo).

Slow (four trainer processes: 10 minutes of wall time on 2 cores shared by five sessions): the
resharding only happens across real process groups of different sizes, so nothing smaller tests
it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from finetune_assets.core.launchers.base import torchrun_command
from finetune_assets_tests.core.training.fixtures import write_mds_splits
from finetune_assets_tests.core.training.test_torchrun import REPO, write_config

pytestmark = pytest.mark.slow


def _run(config: Path, nproc: int, output: Path) -> dict:
    import json

    cfg = json.loads(config.read_text())
    cfg["output_dir"] = str(output)
    config.write_text(json.dumps(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = torchrun_command(str(config), nproc_per_node=nproc, python=sys.executable)
    done = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return json.loads((output / "metrics.json").read_text())


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "model" / "model.safetensors")


def _assert_same(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=atol, msg=key)


def test_sharded_checkpoints_write_per_rank_shards_and_resume_at_another_world_size(
    tmp_path, _tiny_model_session, arabic_reviews
):
    """Epoch 1 on 2 processes, once with sharded and once with full checkpoints: the same
    exported (best) model, and the sharded run's ``last.ckpt`` and ``best/best.ckpt`` are DCP
    folders with one shard file per rank. Epoch 2 on 1 process, resumed from each: the DCP load
    reshards weights and AdamW state from 2 ranks to 1, so both end with the same weights (the
    full state is the reference: it holds every tensor whole). Tolerance 1e-6 absolute: the same
    operations in the same order, only the checkpoint's layout differs.
    """
    shards = write_mds_splits(
        tmp_path / "shards", _tiny_model_session, arabic_reviews / "PROD.csv", sizes=(48, 12, 12)
    )
    common = dict(strategy="fsdp", epochs=1, lr=1e-3, class_weights="none")
    runs = {}
    for fmt in ("sharded", "full"):
        config = write_config(
            tmp_path, fmt, _tiny_model_session, shards, checkpoint_format=fmt, **common
        )
        runs[fmt] = (config, _run(config, 2, tmp_path / fmt / "epoch1"))
    sharded_cfg, first = runs["sharded"]
    ckpt = sharded_cfg.parent / "ckpt"
    for folder in (ckpt / "last.ckpt", ckpt / "best" / "best.ckpt"):
        assert (
            folder.is_dir() and (folder / "meta.pt").is_file() and (folder / ".metadata").is_file()
        )
        assert len(list(folder.glob("*.distcp"))) == 2, sorted(p.name for p in folder.iterdir())
    assert not list(ckpt.glob("*.partial")) and not list(ckpt.glob("*.old"))
    assert (runs["full"][0].parent / "ckpt" / "last.ckpt").is_file()
    assert first["model_selection"]["selected"] == "best"
    _assert_same(
        _weights(tmp_path / "full" / "epoch1"), _weights(tmp_path / "sharded" / "epoch1"), 1e-6
    )

    second = {}
    for fmt, (config, before) in runs.items():
        import json

        cfg = json.loads(config.read_text())
        # the last weights: the best could be epoch 1's, which epoch 2's training would not touch
        config.write_text(json.dumps({**cfg, "epochs": 2, "select_model": "last"}))
        second[fmt] = _run(config, 1, tmp_path / fmt / "epoch2")
        assert second[fmt]["world_size"] == 1
        assert second[fmt]["resumed_at_step"] == before["global_step"] == 6  # 48 / (2 x 4)
        assert second[fmt]["global_step"] == 6 + 12  # epoch 2: 48 / (1 x 4) steps
    after = _weights(tmp_path / "sharded" / "epoch2")
    _assert_same(_weights(tmp_path / "full" / "epoch2"), after, 1e-6)
    moved = max(
        (after[k] - v).abs().max() for k, v in _weights(tmp_path / "sharded" / "epoch1").items()
    )
    assert moved > 1e-4  # epoch 2 trained
    assert len(list((ckpt / "last.ckpt").glob("*.distcp"))) == 1  # re-saved by one rank


def test_a_save_broken_off_between_the_renames_puts_the_previous_checkpoint_back(tmp_path):
    """``save_sharded`` swaps by two renames (previous -> ``.old``, new -> path); a crash between
    them leaves only ``.old``, which the next start restores. A complete folder is left alone.
    """
    from finetune_assets.core.training.data.sharding import (
        META,
        is_sharded_checkpoint,
        recover_swap,
    )

    last = tmp_path / "last.ckpt"
    old = tmp_path / "last.ckpt.old"
    old.mkdir()
    (old / META).write_bytes(b"meta")
    assert recover_swap(str(last)) and is_sharded_checkpoint(str(last)) and not old.exists()
    old.mkdir()  # a newer complete save exists: .old is not put over it
    assert not recover_swap(str(last)) and old.exists()
