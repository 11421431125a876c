"""The GPU check's CPU rehearsal (``benchmarks/gpu/smoke.py --cpu-check``) in CI.

It proves the script's plumbing, and measures nothing: every leg runs, on the tiny BERT and CPU
(gloo), through the trainer's own ``train()``: the functional cases (fit, validate, test, export,
resume from an object-store URL, SIGKILL and resume) for ``ddp`` and ``fsdp``, the measurement
leg at the trainer's defaults, and the 2-process DDP leg as 2 CPU processes under ``torchrun``
(its all-rank vs per-device split checked). What only a GPU runs is not here: the BERT-base-size
model, bf16, the GPU batch sizing and the compiled leg (compile itself: ``test_device_settings``),
and ``run.sh``'s offline install of the carried wheels (it needs ``prepare.sh``'s downloads).

Slow (about 15 trainer runs and 5 fresh processes): the script is only proven by running it whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from finetune_assets.data.models import packaged_model_dir

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_every_leg_on_cpu(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/gpu/smoke.py"),
            "--cpu-check",
            "--tokenizer",
            str(packaged_model_dir()),
        ],  # fmt: skip
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    report_file = out / "gpu_smoke.json"
    assert report_file.exists(), (done.stdout + done.stderr)[-5000:]
    report = json.loads(report_file.read_text())
    failed = {
        c["case"]: c.get("checks") or c.get("error") or c.get("log")
        for c in report["cases"] + report["legs"]
        if not c.get("passed", "skipped" in c)
    }
    assert done.returncode == 0 and report["passed"], failed
    assert [c["case"] for c in report["cases"]] == ["tiny-ddp", "tiny-fsdp"]
    legs = {leg["case"]: leg for leg in report["legs"]}
    assert set(legs) == {"defaults", "ddp2"}  # no compiled leg on CPU
    assert legs["defaults"]["device_settings"]["batch_size"] == 8  # CPU keeps batch_size
    assert legs["ddp2"]["world_size"] == 2
    assert legs["ddp2"]["checks"]["all_ranks_about_world_x_device"]
    assert report["mfu_goal_met"] is None  # no peak known on CPU: nothing measured
