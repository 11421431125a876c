"""GPUs or a clear refusal, and failures classified by evidence, on the real plane.

The plane's nodes advertise ``nvidia.com/gpu: 8`` that are counted by the scheduler but have no
CUDA behind them: exactly a GPU pod on a CPU image or without the driver on its loader path. The
NCCL row: a trainer that prints torch's watchdog line and exits 1, as a collective timing out does.
"""

from __future__ import annotations

import pytest

from finetune_assets_tests.core.launchers.k8s.helpers import launch_in_dagster
from finetune_assets_tests.core.launchers.k8s.plane_objects import cluster_in, namespace

pytestmark = pytest.mark.control_plane

GANG_STANDIN = "finetune_assets_tests.core.launchers.k8s.gang_standin"


def test_a_pod_given_gpus_that_sees_no_cuda_fails_at_once_naming_image_and_driver(
    control_plane, instance
) -> None:
    ns = namespace(control_plane, "gpu-refusal")
    launcher = cluster_in(control_plane, ns).launcher(
        image="registry.example/finetune-assets:0.1.0",  # the CPU build, by mistake
        gpus_per_node=1,
        shm_size="256Mi",
        memory_limit="2Gi",
        max_resubmissions=2,
    )
    launched = launch_in_dagster(launcher, "standin:ok", instance)
    assert not launched.success
    logs = launched.logs
    assert "CUDA preflight failed" in logs and "CUDA sees 0" in logs, logs[-4000:]
    assert "Image: registry.example/finetune-assets:0.1.0" in logs
    assert "driver path: /usr/local/nvidia/lib64" in logs
    assert (
        "(configuration: a pod given GPUs sees no CUDA device (image or driver path); not retried)"
        in logs
    )
    assert "resubmitting" not in logs
    assert "standin: node=" not in logs  # torchrun never started: no CPU training on GPU nodes


def test_an_nccl_timeout_is_resubmitted_and_the_new_gang_finishes(
    control_plane, instance, tmp_path
) -> None:
    ns = namespace(control_plane, "nccl-retry")
    launcher = cluster_in(control_plane, ns).launcher(
        trainer_module=GANG_STANDIN, max_resubmissions=1
    )
    launched = launch_in_dagster(
        launcher, f"standin:nccl=once,train=3,step_s=0.1,dir={tmp_path}", instance
    )
    assert launched.success, launched.logs[-6000:]
    assert "transient: NCCL timeout" in launched.logs
    assert "resubmitting the gang (1/1)" in launched.logs
    assert "trained global_step=3" in launched.logs


def test_an_nccl_timeout_every_time_spends_the_budget_and_fails(
    control_plane, instance, tmp_path
) -> None:
    ns = namespace(control_plane, "nccl-budget")
    launcher = cluster_in(control_plane, ns).launcher(
        trainer_module=GANG_STANDIN, max_resubmissions=1
    )
    launched = launch_in_dagster(launcher, f"standin:nccl=always,dir={tmp_path}", instance)
    assert not launched.success
    assert "resubmitting the gang (1/1)" in launched.logs
    assert "disrupted 2 time(s), more than max_resubmissions=1" in launched.logs
