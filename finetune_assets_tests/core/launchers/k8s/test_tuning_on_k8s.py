"""``tuning_study`` with the k8s launcher: parallel trials as separate gangs, within the pool limit.

Dagster run -> tuning_study (Optuna; trials at once capped by the ``training`` pool) ->
K8sTorchrunLauncher -> Kubernetes API (the local plane: the real Job controller) -> one Indexed Job
per trial -> a trial
stand-in that reports to the study through its journal on the shared storage
(``trial_standin.py``; the real trainer's reporting is covered by training/test_tuning.py).
"""

from __future__ import annotations

import dagster as dg
import optuna
import pytest

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.launchers.k8s import GANG_LABEL
from finetune_assets.core.tuning import study as tuning
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.tuning.space import TuningConfig
from finetune_assets.defs.tuning.study_asset import study_storage, tuning_study
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets_tests.core.launchers.k8s.conftest import Cluster
from finetune_assets_tests.core.training.fixtures import publish_upstream

pytestmark = [pytest.mark.k8s]


def test_parallel_trials_run_as_one_gang_each_within_the_training_pool_limit(
    cluster: Cluster, storage_root, instance, tiny_model_dir, arabic_reviews
) -> None:
    store = Storage(str(storage_root))
    publish_upstream(store, "v1", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(48, 16, 16))
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    instance.event_log_storage.set_concurrency_slots("training", 2)  # dagster.yaml: pools
    launcher = cluster.launcher(
        trainer_module="finetune_assets_tests.core.launchers.k8s.trial_standin", timeout_s=180
    )
    config = {
        "n_trials": 3,
        "parallel_trials": 3,  # more than the pool allows: the third trial waits for a free slot
        "trial_max_steps": 4,
        "reports_per_trial": 2,
        "pruner": "none",
        "fixed": {"accelerator": "cpu", "max_length": 64},
    }
    with cluster.job_events() as log:
        result = dg.materialize(
            [tuning_study],
            partition_key="v1",
            instance=instance,
            run_config=dg.RunConfig(ops={"tuning_study": {"config": config}}),
            resources={
                "storage": StorageResource(root=str(storage_root)),
                "launcher": launcher,
                "mlflow": MlflowResource(ui_base_url="http://mlflow.example:5000"),
            },
            raise_on_error=False,
        )
    logs = "\n".join(e.user_message or "" for e in instance.all_logs(result.run_id))
    assert result.success, logs[-6000:]
    assert "parallel_trials 3 > the training pool's limit 2: running 2 trials at once" in logs

    live: set[str] = set()
    most = 0
    for event, name, _ in log:
        (live.add if event == "created" else live.discard)(name)
        most = max(most, len(live))
    created = [(name, labels) for event, name, labels in log if event == "created"]
    assert len(created) == 3 and most == 2, log  # 2 at once (stand-ins wait for a 2nd), never 3
    assert len({labels[GANG_LABEL] for _, labels in created}) == 3  # a gang per trial
    assert {labels["dagster/partition"] for _, labels in created} == {
        f"v1.trial-{n}" for n in range(3)
    }
    study = optuna.load_study(
        study_name=tuning.study_name("v1", TuningConfig(**config)),
        storage=tuning.open_storage(study_storage(TuningConfig(), store, "v1")),
    )
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert all(cluster.leftovers(name) == {} for name, _ in created)
