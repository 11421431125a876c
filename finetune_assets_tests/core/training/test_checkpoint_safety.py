"""A planted checkpoint cannot run code: resume loads with ``weights_only=True``."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from finetune_assets_tests.core.training.fixtures import write_mds_splits
from finetune_assets_tests.core.training.test_torchrun import REPO, write_config

pytestmark = pytest.mark.slow


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):  # what a hostile pickle does when it is loaded without weights_only
        return (os.system, (f"touch {self.marker}",))


def test_hostile_last_checkpoint_is_refused_not_executed(tiny_model_dir, arabic_reviews, tmp_path):
    shards = write_mds_splits(
        tmp_path / "shards", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(16, 8, 8)
    )
    config = write_config(tmp_path, "run", tiny_model_dir, shards, epochs=1)
    ckpt_dir = config.parent / "ckpt"
    ckpt_dir.mkdir(parents=True)
    marker = tmp_path / "pwned"
    with open(ckpt_dir / "last.ckpt", "wb") as f:
        pickle.dump({"state_dict": _Payload(str(marker))}, f)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "finetune_assets.core.training", "--config", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, "a hostile checkpoint must not be resumed from"
    assert "weights_only" in proc.stderr + proc.stdout or "Unpickl" in proc.stderr + proc.stdout
    assert not marker.exists(), "the checkpoint's pickle ran code"
