"""Faults that really happen to a training run: a killed worker (torchrun restarts the group) and a
killed run.

The killed worker resumes from ``last.ckpt`` with the streaming state, so it must end exactly where
an uninterrupted run ends: the same samples (count and token total), the same steps, and the same
weights. Weights are compared with a float tolerance (1e-5 absolute): every sample, its order, the
optimizer and scheduler state and the dropout masks (seeded per batch, see
``ReviewClassifier.on_train_batch_start``) are the same, so only float reduction order could differ.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest
from safetensors.torch import load_file

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.launchers.base import TrainingSpec, torchrun_command
from finetune_assets.core.launchers.local import process_tree
from finetune_assets.defs.models.finetuned import finetuned_model
from finetune_assets.defs.resources.launchers import LocalTorchrunLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets_tests.core.training.fixtures import publish_upstream, write_mds_splits
from finetune_assets_tests.core.training.test_torchrun import write_config
from finetune_assets_tests.processes import kill_tree

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]
SETTINGS = {"epochs": 1, "checkpoint_every_n_steps": 2}  # 96 samples, 2 ranks x 4: 12 steps


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _workers(agent: int) -> dict[int, int]:
    """rank -> pid of the trainer processes under torchrun (``agent``)."""
    out = {}
    for pid in process_tree(agent):
        cmd = _cmdline(pid)
        if (
            pid == agent
            or "finetune_assets.core.training" not in cmd
            or "torch.distributed.run" in cmd
        ):
            continue
        try:
            env = dict(
                kv.split("=", 1)
                for kv in Path(f"/proc/{pid}/environ").read_text().split("\0")
                if "=" in kv
            )
        except OSError:
            continue
        if "RANK" in env:
            out[int(env["RANK"])] = pid
    return out


def _kill_after_checkpoint(
    proc: subprocess.Popen, last: Path, rank: int = 1, timeout: float = 240
) -> int | None:
    """SIGKILL one worker once ``last`` exists (mid-epoch); its pid, or None if the run ended
    first.
    """
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if last.exists():
            pid = _workers(proc.pid).get(rank)
            if pid:
                os.kill(pid, signal.SIGKILL)
                return pid
        time.sleep(0.02)
    return None


def _weights(config: Path) -> dict:
    return load_file(str(config.parent / "out" / "model" / "model.safetensors"))


def test_a_killed_worker_is_restarted_and_the_run_ends_like_an_uninterrupted_one(
    tmp_path, _tiny_model_session, arabic_reviews
):
    shards = write_mds_splits(tmp_path / "shards", _tiny_model_session, arabic_reviews / "PROD.csv")
    # Separate roots: each run gets its own MLflow store (two processes creating one SQLite schema
    # race).
    reference_cfg = write_config(
        tmp_path / "reference", "run", _tiny_model_session, shards, **SETTINGS
    )
    faulted_cfg = write_config(tmp_path / "faulted", "run", _tiny_model_session, shards, **SETTINGS)

    def run(cfg: Path, max_restarts: int, fault: bool = False) -> tuple[int, str, int | None]:
        """torchrun to completion (log to a file: a pipe nobody reads would stall the workers)."""
        log = cfg.parent / "torchrun.log"
        with open(log, "w") as out:
            cmd = torchrun_command(str(cfg), nproc_per_node=2, max_restarts=max_restarts)
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=_env(),
                start_new_session=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            killed = (
                _kill_after_checkpoint(proc, cfg.parent / "ckpt" / "last.ckpt") if fault else None
            )
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                kill_tree(proc.pid)
                proc.wait()
        return proc.returncode, log.read_text(), killed

    # One after the other: two gloo groups starting at once on one host can refuse each other's
    # connections.
    rc, log, _ = run(reference_cfg, 0)
    assert rc == 0, f"reference run failed:\n{log[-4000:]}"
    rc, log, killed = run(faulted_cfg, 1, fault=True)
    assert killed, f"the faulted run ended before a worker could be killed:\n{log[-4000:]}"
    assert rc == 0, f"the restarted run failed (exit {rc}):\n{log[-6000:]}"

    reference = json.loads((reference_cfg.parent / "out" / "metrics.json").read_text())
    resumed = json.loads((faulted_cfg.parent / "out" / "metrics.json").read_text())
    # the restarted group resumed
    assert resumed["resumed_from"] == str(faulted_cfg.parent / "ckpt" / "last.ckpt")
    assert 0 < resumed["resumed_at_step"] < reference["global_step"] == 12
    # exactly: no sample repeated or skipped
    for key in (
        "samples_seen",
        "tokens_seen",
        "global_step",
    ):
        assert resumed[key] == reference[key], key
    assert resumed["samples_seen"] == 96
    ref_w, res_w = _weights(reference_cfg), _weights(faulted_cfg)
    assert ref_w.keys() == res_w.keys()
    worst = max(float((ref_w[k] - res_w[k]).abs().max()) for k in ref_w)
    assert worst < 1e-5, f"weights differ from the uninterrupted run by up to {worst}"


class KillWholeRunLauncher(LocalTorchrunLauncher):
    """Like a node loss: SIGKILL torchrun and every worker once a checkpoint exists (the asset
    then fails).
    """

    def launch(self, context: dg.AssetExecutionContext, job: TrainingSpec) -> None:
        checkpoint_dir = Path(json.loads(Path(job.config_url).read_text())["checkpoint_dir"])
        done = threading.Event()

        def killer() -> None:
            while not done.is_set():
                if (checkpoint_dir / "last.ckpt").exists():
                    for proc in psutil.process_iter():
                        if job.config_url in _cmdline(proc.pid):
                            try:
                                os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
                            except (ProcessLookupError, PermissionError):
                                pass
                    return
                time.sleep(0.02)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            super().launch(context, job)
        finally:
            done.set()
            thread.join()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_killed_run_rematerialized_with_the_same_inputs_resumes(
    storage_root, instance, tiny_model_dir, arabic_reviews
):
    store = Storage(str(storage_root))
    publish_upstream(store, "v1", tiny_model_dir, arabic_reviews / "PROD.csv")
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    run_config = dg.RunConfig(
        ops={
            "finetuned_model": {
                "config": {
                    "epochs": 1,
                    "batch_size": 4,
                    "accelerator": "cpu",
                    "num_workers": 0,
                    "checkpoint_every_n_steps": 3,
                }
            }
        }
    )
    resources = {"storage": StorageResource(root=str(storage_root)), "mlflow": MlflowResource()}

    def materialize(launcher: LocalTorchrunLauncher) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            [finetuned_model],
            partition_key="v1",
            instance=instance,
            run_config=run_config,
            resources={**resources, "launcher": launcher},
            raise_on_error=False,
        )

    killed = materialize(KillWholeRunLauncher(nproc_per_node=1, cwd=str(REPO)))
    # nothing half-published
    assert not killed.success and store.current("finetuned_model", "v1") is None
    checkpoints = list(
        (storage_root / "finetuned_model" / "v1" / "checkpoints").glob("*/last.ckpt")
    )
    assert len(checkpoints) == 1

    again = materialize(LocalTorchrunLauncher(nproc_per_node=1, cwd=str(REPO)))
    assert again.success
    meta = again.asset_materializations_for_node("finetuned_model")[0].metadata
    # resumed from the killed run's checkpoint, not from scratch
    assert meta["resumed_at_step"].value > 0
    assert meta["checkpoint_key"].value == checkpoints[0].parent.name
    assert meta["samples_seen"].value == 96 and meta["global_step"].value == 96 // 4
