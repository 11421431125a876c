"""What a real cluster does to a gang that the kind path never shows, played by the API double's faults.

Delays are scaled down from minutes to seconds; each test names the defect it would have caught.
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from finetune_assets_tests.k8s.conftest import Cluster, free_port
from finetune_assets_tests.k8s.helpers import launch_in_dagster

pytestmark = pytest.mark.k8s


def test_pod0_starting_last_still_trains_with_rank0_on_pod0(cluster: Cluster, isolated, faults, instance) -> None:
    """Pod 0 waits for its GPU node / image while pod 1 already runs: pod 1 waits in the rendezvous."""
    faults.pending_s = {0: 3.0}
    launched = launch_in_dagster(cluster.launcher(nnodes=2, rdzv_port=free_port()), "standin:allreduce", instance)
    assert launched.success, launched.logs
    assert "standin: allreduce=3 world=2" in launched.logs
    assert re.search(r"standin: node=0 rank=0 world=2 attempt=0 host=\S+-0\b", launched.logs), launched.logs


def test_rendezvous_timeout_shorter_than_the_start_gap_fails(cluster: Cluster, isolated, faults, instance) -> None:
    """The join/read timeout governs how long pods wait for pod 0 (torchrun's default would be 60 s)."""
    faults.pending_s = {0: 30.0}
    launched = launch_in_dagster(cluster.launcher(nnodes=2, rdzv_port=free_port(), rdzv_timeout_s=2, timeout_s=60),
                                 "standin:ok", instance)
    assert not launched.success
    assert "pod(s) failed" in launched.logs and "Rendezvous" in launched.logs, launched.logs[-3000:]
    assert launched.seconds < 30


def test_lagging_dns_still_trains(cluster: Cluster, isolated, faults, instance) -> None:
    """Pod DNS names resolve seconds after the pods run: pod 0 hosts the store without resolving itself."""
    faults.dns_lag_s = 10.0
    launched = launch_in_dagster(cluster.launcher(nnodes=2, rdzv_port=free_port()), "standin:allreduce", instance)
    assert launched.success, launched.logs
    assert "standin: allreduce=3 world=2" in launched.logs


# -- disruption: eviction and node loss resubmit the gang, which resumes ---------------------------


def _pods_of_index(double, index: int) -> list[str]:
    return [n for n in double.live_processes() if re.search(rf"-{index}-\w{{5}}$", n)]


def _when_step(ckpt, step: int, then, timeout_s: float = 60.0) -> threading.Thread:
    def run() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ckpt.exists() and int(ckpt.read_text() or 0) >= step:
                then()
                return
            time.sleep(0.1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("disruption", ["evict", "node_not_ready"])
def test_a_disrupted_pod_resubmits_the_gang_which_resumes(cluster: Cluster, double, faults, instance, tmp_path,
                                                          disruption) -> None:
    """Spot reclaim / drain (eviction) or a node lost: a fresh gang resumes from the checkpoint and finishes."""
    ckpt = tmp_path / "step"
    disrupt = double.evict if disruption == "evict" else lambda pod: double.node_not_ready(pod, evict_after_s=1.0)
    _when_step(ckpt, 3, lambda: disrupt(_pods_of_index(double, 1)[0]))
    launched = launch_in_dagster(cluster.launcher(nnodes=2, rdzv_port=free_port(), max_resubmissions=1, timeout_s=120),
                                 f"standin:train=10,step_s=0.5,ckpt={ckpt}", instance)
    assert launched.success, launched.logs[-4000:]
    assert "DisruptionTarget" in launched.logs or "Eviction" in launched.logs or "TaintManager" in launched.logs
    assert "resubmitting the gang (1/1)" in launched.logs
    finished = re.findall(r"standin: trained global_step=(\d+) resumed_at=(\d+)", launched.logs)
    assert len(finished) == 1, launched.logs[-3000:]  # only the resubmitted gang finished
    assert finished[0][0] == "10" and int(finished[0][1]) >= 3  # same global step as uninterrupted, resumed
    assert double.live_processes() == []


def test_a_training_failure_is_not_resubmitted(cluster: Cluster, double, instance) -> None:
    launched = launch_in_dagster(cluster.launcher(nnodes=2, rdzv_port=free_port(), max_resubmissions=3, timeout_s=120),
                                 "standin:fail-node=1", instance)
    assert not launched.success and "boom on node 1" in launched.logs
    assert "resubmitting" not in launched.logs and launched.logs.count("Launching training Job") == 1
