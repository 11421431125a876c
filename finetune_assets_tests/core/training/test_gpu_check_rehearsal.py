"""The GPU check's CPU rehearsal (``benchmarks/gpu/smoke.py --cpu-check --legs measure``) in CI.

It proves the plumbing of the measurement legs, and measures nothing: on the tiny BERT and CPU,
through the trainer's own ``train()`` at its defaults, the one-device leg in-process and the
2-process DDP leg as 2 CPU processes under ``torchrun`` (gloo; its all-rank vs per-device split
checked), then the report's ``measured`` table. The second test runs the whole
``--cpu-check``, the functional cases too (fit, test, export, resume from an object-store URL,
SIGKILL and resume). Not here: what only a GPU runs: the BERT-base-size model, bf16, the GPU
batch sizing, the compiled leg (compile itself: ``test_device_settings``) and ``run.sh``'s
offline install of the carried wheels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from finetune_assets.core.prep.pretrained import packaged_model_dir

pytestmark = pytest.mark.slow  # two trainer runs, one of them 2 fresh processes
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(1800)
def test_the_gpu_checks_measurement_legs_run_on_cpu(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/gpu/smoke.py"),
            "--cpu-check",
            "--legs",
            "measure",
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
    assert report["cases"] == []  # --legs measure
    legs = {leg["case"]: leg for leg in report["legs"]}
    assert set(legs) == {"defaults", "ddp2"}  # no compiled leg on CPU
    assert legs["defaults"]["device_settings"]["batch_size"] == 8  # CPU keeps batch_size
    assert legs["ddp2"]["world_size"] == 2
    assert legs["ddp2"]["checks"]["all_ranks_about_world_x_device"]
    assert report["mfu_goal_met"] is None  # no peak known on CPU: nothing measured


@pytest.mark.skipif(
    os.environ.get("FINETUNE_GPU_CHECK_FULL") != "1",
    reason="the whole CPU rehearsal is opt-in (FINETUNE_GPU_CHECK_FULL=1; 6+ minutes): CI runs the "
    "measurement legs above, and the functional cases run in the training tests",
)
@pytest.mark.timeout(2400)
def test_the_whole_gpu_check_runs_on_cpu(tmp_path):
    """``--cpu-check`` whole: the functional cases (``tiny-ddp``, ``tiny-fsdp``: fit, validate,
    test, export and predict, resume from ``memory://``, SIGKILL and resume in a new process) and
    the measurement legs. 367 s when run directly at a lower load on 2 shared cores (2026-12-02,
    ``benchmarks/results/gpu_check_cpu_rehearsal.json``); over 15 minutes at load 60+.
    """
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
        timeout=2300,
        check=False,
    )
    report = json.loads((out / "gpu_smoke.json").read_text())
    assert done.returncode == 0 and report["passed"], (done.stdout + done.stderr)[-5000:]
    assert [c["case"] for c in report["cases"]] == ["tiny-ddp", "tiny-fsdp"]
    assert {leg["case"] for leg in report["legs"]} == {"defaults", "ddp2"}
