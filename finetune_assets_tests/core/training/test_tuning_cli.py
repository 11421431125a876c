"""The study is its config, through the CLI as a user types it (``dagster asset materialize``): a
study's ``fixed`` settings reach the final model, and a changed search space is a new study whose
best trial lies inside the new space (the old study is kept and listed).

Subprocesses with a temporary ``DAGSTER_HOME`` and storage root, the real torchrun launcher and the
embedded MLflow store; a tiny model and 2-step trials keep it to minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from finetune_assets.core.training.trial.study_storage import open_storage
from finetune_assets_tests.deploy.test_deployment_backfill import _drops
from finetune_assets_tests.e2e.test_user_path import DATA_ASSETS, sh, user_env  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
VERSION = "v1"  # 200 reviews, 2 classes: quick to prepare
QUICK = {"num_workers": 0, "limit_val_batches": 2, "limit_test_batches": 2}
FIXED = {**QUICK, "max_length": 48, "gradient_clip_val": 0.5, "accelerator": "cpu"}
STUDY = {
    "n_trials": 2,
    "trial_max_steps": 2,
    "reports_per_trial": 1,
    "epochs": [1],
    "batch_size": [8],
    "pruner": "none",
    "sampler_startup_trials": 1,
    "fixed": FIXED,
}


def materialize(env: dict[str, str], select: str, ops: dict) -> None:
    sh(
        env,
        "dagster",
        "asset",
        "materialize",
        "-m",
        "finetune_assets.definitions",
        "--select",
        select,
        "--partition",
        VERSION,
        "--config-json",
        json.dumps({"ops": ops}),
    )


def best(root: Path) -> dict:
    pointer = json.loads((root / "tuning_study" / VERSION / "CURRENT").read_text())
    files = [p for p in (root / "tuning_study" / VERSION).rglob("best.json")]
    return json.loads(next(p for p in files if pointer["attempt"] in str(p)).read_text())


def test_a_study_is_its_config_through_the_cli(
    user_env,  # noqa: F811
    tiny_model_dir,
    arabic_reviews,
    tmp_path,
):
    from mlflow import MlflowClient

    root = Path(user_env["FINETUNE_ASSETS_ROOT"])
    source = _drops(tmp_path, arabic_reviews)[VERSION]
    sh(user_env, "finetune-assets", "versions", "add", VERSION, "--source", str(source))
    materialize(
        user_env, DATA_ASSETS, {"pretrained_model": {"config": {"source": str(tiny_model_dir)}}}
    )

    first = {**STUDY, "lr_low": 1e-5, "lr_high": 2e-5}
    materialize(user_env, "tuning_study", {"tuning_study": {"config": first}})
    won = best(root)
    assert won["fixed"]["max_length"] == 48 and won["fixed"]["gradient_clip_val"] == 0.5
    assert 1e-5 <= won["params"]["lr"] <= 2e-5

    final = {"hyper_parameters_from": "study", "max_steps": 2, "batch_size": 8, **QUICK}
    gate_off = {"must_beat_majority_baseline": False, "baseline_margin": None}
    materialize(
        user_env,
        "finetuned_model",
        {
            "finetuned_model": {"config": final},
            "finetuned_model_quality_gate": {"config": gate_off},
        },
    )
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("review-classifier").experiment_id
    runs = [r for r in client.search_runs([exp]) if "tuned_from_trial" in r.data.tags]
    assert len(runs) == 1
    params = runs[0].data.params
    assert params["max_length"] == "48" and params["gradient_clip_val"] == "0.5"
    assert float(params["lr"]) == pytest.approx(won["params"]["lr"])

    # Another space: another study (its own name, its own trials), the first one kept and listed.
    second = {**STUDY, "lr_low": 1e-4, "lr_high": 2e-4}
    materialize(user_env, "tuning_study", {"tuning_study": {"config": second}})
    again = best(root)
    assert again["study_name"] != won["study_name"]
    assert 1e-4 <= again["params"]["lr"] <= 2e-4
    folder = next(
        p.parent
        for p in (root / "tuning_study" / VERSION).rglob("best.json")
        if json.loads(p.read_text())["study_name"] == again["study_name"]
    )
    trials = json.loads((folder / "trials.json").read_text())
    assert len(trials) == 2 and all(1e-4 <= t["params"]["lr"] <= 2e-4 for t in trials)
    journal = str(root / "tuning" / VERSION / "study.journal")
    assert set(optuna.get_all_study_names(open_storage(journal))) == {
        won["study_name"],
        again["study_name"],
    }
