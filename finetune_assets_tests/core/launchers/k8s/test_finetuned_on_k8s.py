"""``finetuned_model`` materializes with the k8s launcher, 2 pods x 1 process.

Dagster run -> K8sTorchrunLauncher -> the local plane's API server -> the real Job controller and
scheduler -> Indexed Job, 2 pods on the node agents -> torchrun c10d rendezvous through the headless
Service -> the real trainer (gloo, CPU) -> model, metrics and an MLflow run under the storage
root -> materialization metadata.
"""

from __future__ import annotations

import dagster as dg
import pytest

from finetune_assets.core.io.storage import Storage
from finetune_assets.defs.models.finetuned import finetuned_model
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets_tests.core.launchers.k8s.conftest import Cluster, free_port
from finetune_assets_tests.core.launchers.k8s.kubelet import isolation_flags
from finetune_assets_tests.core.launchers.k8s.plane import wait_until
from finetune_assets_tests.core.training.fixtures import publish_upstream as _publish_upstream

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def test_finetuned_model_trains_across_two_pods(
    cluster: Cluster, storage_root, instance, tiny_model_dir, arabic_reviews
) -> None:
    # The storage root here is a local folder, which the plane's pods (local processes) share; on
    # a real cluster run the same flow with an s3:// root (deploy/README.md, "Run a
    # materialization").
    if cluster.plane is None:
        pytest.skip("a local storage root is shared only by the local plane's pods")
    if isolation_flags() is None:
        pytest.skip(
            "two 'pods' on one host need private /dev/shm mounts (unshare) for mosaicml-streaming"
        )
    store = Storage(str(storage_root))
    _publish_upstream(store, "v1", tiny_model_dir, arabic_reviews / "PROD.csv")
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    launcher = cluster.launcher(
        nnodes=2,
        nproc_per_node=1,
        rdzv_port=free_port(),
        trainer_module="finetune_assets.core.training",
        timeout_s=600,
        env={"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},
    )
    result = dg.materialize(
        [finetuned_model],
        partition_key="v1",
        instance=instance,
        run_config=dg.RunConfig(
            ops={
                "finetuned_model": {
                    "config": {
                        "epochs": 1,
                        "accelerator": "cpu",
                        "num_workers": 0,
                        "checkpoint_every_n_steps": 5,
                        "log_every_n_steps": 2,
                    }
                }
            }
        ),
        resources={
            "storage": StorageResource(root=str(storage_root)),
            "launcher": launcher,
            "mlflow": MlflowResource(ui_base_url="http://mlflow.example:5000"),
        },
        raise_on_error=False,
    )
    logs = "\n".join(e.user_message or "" for e in instance.all_logs(result.run_id))
    assert result.success, logs[-8000:]
    assert "2 pod(s) x 1 process(es)" in logs and "all 2 pod(s) succeeded" in logs
    meta = result.asset_materializations_for_node("finetuned_model")[0].metadata
    # one epoch over the 96 training reviews, both ranks together
    assert meta["samples_seen"].value == 96
    assert 0.0 <= meta["accuracy"].value <= 1.0
    assert meta["mlflow_run"].value.startswith("http://mlflow.example:5000/#/experiments/")
    assert store.require("finetuned_model", "v1") is not None
    # every pod process ended (the Job and its pods are deleted after the run)
    wait_until(
        lambda: cluster.plane.live_pod_processes(cluster.namespace) == [], 60, "pod processes"
    )
