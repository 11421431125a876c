"""The fencing token on checkpoint commits (core/training/checkpoints/fencing.py): a stale gang
cannot commit.
"""

from __future__ import annotations

import pytest
import torch

from finetune_assets.core.training.checkpoints import fencing
from finetune_assets.core.training.checkpoints.trainer_files import AtomicCheckpointIO


def test_a_newer_gang_fences_off_the_older_ones_commits(tmp_path, monkeypatch) -> None:
    io = AtomicCheckpointIO(fence_dir=str(tmp_path))
    ckpt = tmp_path / "last.ckpt"
    monkeypatch.setenv(fencing.GENERATION_ENV, "100")
    fencing.raise_fence(str(tmp_path))
    io.save_checkpoint({"step": 1}, ckpt)
    fencing.raise_fence(str(tmp_path), 200)  # the new gang's rank 0, before it reads
    with pytest.raises(fencing.FencedOff, match="generation 200"):
        io.save_checkpoint({"step": 2}, ckpt)
    assert torch.load(ckpt)["step"] == 1  # the stale commit left nothing behind
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staged file left
    with pytest.raises(fencing.FencedOff):  # a stale gang starting late is stale at once
        fencing.raise_fence(str(tmp_path))
    monkeypatch.setenv(fencing.GENERATION_ENV, "200")
    io.save_checkpoint({"step": 3}, ckpt)
    assert torch.load(ckpt)["step"] == 3


def test_without_a_generation_nothing_is_fenced(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(fencing.GENERATION_ENV, raising=False)
    fencing.raise_fence(str(tmp_path))
    assert not (tmp_path / fencing.FENCE_FILE).exists()
    AtomicCheckpointIO(fence_dir=str(tmp_path)).save_checkpoint({"x": 1}, tmp_path / "a.ckpt")
