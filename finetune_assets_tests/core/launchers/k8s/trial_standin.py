"""A stand-in for ``finetune_assets.core.training`` in a tuning trial: report to the study, no
training.

Run by the k8s launcher as ``torchrun ... -m finetune_assets_tests.core.launchers.k8s.trial_standin
--config <trainer_config.json>`` (the file the tuning asset wrote, on the storage the pods share).
Like ``TrialPruning`` it opens the study's storage and reports ``trial.reports`` values to its
trial (a score from ``lr``: the study has something to rank). First it waits, up to 60 s, until
two trials have started (files in ``standin-barrier/`` beside the study journal), so a test sees
two trials' gangs at once or fails instead of passing by luck; it exits 3 when none comes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

BARRIER = 2


def main(argv: list[str] | None = None) -> int:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    from finetune_assets.core.training.config import TrainerConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    cfg = TrainerConfig.from_json(ap.parse_args(argv).config)
    trial = cfg.trial
    assert trial is not None, "not a tuning trial: the config has no trial"
    barrier = Path(trial.storage).parent / "standin-barrier"
    barrier.mkdir(exist_ok=True)
    (barrier / f"{trial.trial_id}-{os.environ.get('HOSTNAME', '')}").write_text("")
    deadline = time.monotonic() + 60
    while len(list(barrier.iterdir())) < BARRIER:
        if time.monotonic() > deadline:
            print("trial_standin: no second trial started within 60 s", file=sys.stderr)
            return 3
        time.sleep(0.2)
    # the journal file as core/training/trial/pruning.py opens it (not imported: it pulls in
    # Lightning, ~10
    # s)
    storage = optuna.storages.JournalStorage(JournalFileBackend(trial.storage))
    study = optuna.load_study(study_name=trial.study_name, storage=storage)
    for report in range(1, trial.reports + 1):
        optuna.trial.Trial(study, trial.trial_id).report(cfg.lr * 1000, report)
    print(f"trial_standin: trial {trial.trial_id} reported {trial.reports} values", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
