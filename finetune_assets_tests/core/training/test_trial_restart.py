"""A tuning trial killed mid-run and restarted by torchrun reports at the right indices, and the
pruner and the objective see what the resumed run measured (core/training/trial/pruning.py).

Real: torchrun (``max_restarts=1``), the trainer, its checkpoint resume, the journal storage the
trial reports to, the median pruner. Planted: a completed trial (the median to beat) and stale
reports on the trial (-1 at every index: what an earlier attempt of it left), so a report the
restarted run did not replace, or a pruner that read it, shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import optuna
import pytest

from finetune_assets.core.launchers.base import torchrun_command
from finetune_assets.core.training.trial.study_storage import PRUNED_AT_STEP, open_storage
from finetune_assets_tests.core.training.fixtures import write_mds_splits
from finetune_assets_tests.core.training.test_faults import REPO, _env, _workers
from finetune_assets_tests.core.training.test_torchrun import write_config
from finetune_assets_tests.processes import kill_tree

pytestmark = pytest.mark.slow
REPORTS = 4
STALE = -1.0  # below the planted median (-0.5): a pruner reading it would prune
# 96 train samples, one rank of 4: 24 steps; reports at steps 6, 12, 18, 24; checkpoints every 5
SETTINGS = {"epochs": 1, "checkpoint_every_n_steps": 5, "batch_size": 4}


def _study(journal: str) -> tuple[optuna.Study, int]:
    study = optuna.create_study(
        study_name="restart", storage=open_storage(journal), direction="maximize"
    )
    lr = optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True)
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 1e-4},
            distributions={"lr": lr},
            value=-0.5,
            intermediate_values={k: -0.5 for k in range(1, REPORTS + 1)},
        )
    )
    trial = study.ask()
    for k in range(1, REPORTS + 1):
        study._storage.set_trial_intermediate_value(trial._trial_id, k, STALE)
    return study, trial._trial_id


def _reported(journal: str, trial_id: int) -> dict[int, float]:
    return dict(open_storage(journal).get_trial(trial_id).intermediate_values)


def test_a_restarted_trial_reports_at_the_right_indices_and_the_pruner_sees_them(
    tmp_path, _tiny_model_session, arabic_reviews
):
    shards = write_mds_splits(tmp_path / "shards", _tiny_model_session, arabic_reviews / "PROD.csv")
    journal = str(tmp_path / "study.journal")
    _, trial_id = _study(journal)
    trial = {
        "storage": journal,
        "study_name": "restart",
        "trial_id": trial_id,
        "reports": REPORTS,
        "pruner": {"kind": "median", "startup_trials": 1, "warmup_steps": 0},
    }
    cfg = write_config(tmp_path, "trial", _tiny_model_session, shards, trial=trial, **SETTINGS)
    last = cfg.parent / "ckpt" / "last.ckpt"
    log = cfg.parent / "torchrun.log"
    killed = None
    with open(log, "w") as out:
        cmd = torchrun_command(str(cfg), nproc_per_node=1, max_restarts=1)
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=_env(), start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 300
        # kill the worker once it reported (report 1 replaced) and checkpointed, mid-run
        while proc.poll() is None and time.monotonic() < deadline and killed is None:
            if last.exists() and _reported(journal, trial_id).get(1, STALE) != STALE:
                pid = _workers(proc.pid).get(0)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed = pid
            time.sleep(0.05)
        try:
            proc.wait(timeout=400)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
    text = log.read_text()
    assert killed, f"the run ended before its worker could be killed:\n{text[-4000:]}"
    assert proc.returncode == 0, f"the restarted trial failed:\n{text[-6000:]}"
    metrics = json.loads((cfg.parent / "out" / "metrics.json").read_text())
    assert 0 < metrics["resumed_at_step"] < metrics["global_step"] == 24

    reported = _reported(journal, trial_id)
    assert sorted(reported) == list(range(1, REPORTS + 1))  # no index past the budget, none lost
    assert all(v != STALE for v in reported.values()), reported
    # what each index holds is the last value the trainer logged for it: after the restart
    logged: dict[int, float] = {}
    for line in text.splitlines():
        if "(report " in line and f"trial {trial_id}:" in line:
            value = float(line.split("val/macro_f1 ")[1].split()[0])
            logged[int(line.split("(report ")[1].split("/")[0])] = value
    assert logged.keys() == reported.keys()
    assert all(abs(logged[k] - reported[k]) < 1e-4 for k in reported)
    # the pruner compared real values with the median (-0.5): the trial was never pruned
    frozen = open_storage(journal).get_trial(trial_id)
    assert PRUNED_AT_STEP not in frozen.user_attrs and "-> pruned" not in text
