"""The launcher survives the API server: 429 bursts, 5xx outages, 401s, resets, failing deletes."""

from __future__ import annotations

import re
import time

import kubernetes
import pytest

from finetune_assets.launchers.k8s.api import ApiOutage, call
from finetune_assets_tests.launchers.k8s.conftest import Cluster
from finetune_assets_tests.launchers.k8s.helpers import launch_in_dagster

pytestmark = pytest.mark.k8s


def test_training_survives_a_429_burst_and_a_503_outage_mid_training(
    cluster: Cluster, double, faults, instance, tmp_path
) -> None:
    """Once a pod runs: 429 x3 (Retry-After 1 s), a 500, a 401, a reset, then a 503 outage
    (3 s here, ``api_outage_s``; 30 s behaves the same, only slower): the gang is never torn down
    and trains.
    Then the Job delete fails twice: retried, the gang is removed.
    """
    faults.api_burst = [(429, 1), (429, 1), (429, 1), (500, None), (401, None), ("reset", None)]
    faults.api_outage_s = 3.0
    faults.fail_job_deletes = 2  # and the cleanup's delete fails twice
    ckpt = tmp_path / "ckpt"
    launched = launch_in_dagster(
        cluster.launcher(nnodes=1, api_outage_budget_s=30),
        f"standin:train=8,step_s=0.4,ckpt={ckpt}",
        instance,
    )
    assert launched.success, launched.logs
    assert ckpt.read_text().strip() == "8"  # every step ran: one gang, never restarted
    assert faults.api_injected[429] == 3 and faults.api_injected[503] >= 2, faults.api_injected
    assert re.search(r"Kubernetes API: .*: (429|500|503|401) .*; retrying", launched.logs)
    assert launched.logs.count("Launching training Job") == 1
    assert faults.api_injected[500] == 3  # one in the burst, two on the delete
    assert re.search(r"delete job: 500 Internal Server Error; retrying", launched.logs)
    assert f"Deleted Job {cluster.namespace}/{launched.job_name}" in launched.logs
    assert cluster.leftovers(launched.job_name) == {}


def test_a_job_that_cannot_be_deleted_is_suspended_and_the_log_says_so(
    cluster: Cluster, double, faults, instance
) -> None:
    """Deletes keep failing past the outage budget: the Job is suspended (its pods terminated)."""
    # the pod is still starting when the launch fails
    faults.fail_job_deletes, faults.pending_s = (
        1000,
        {0: 60.0},
    )
    launcher = cluster.launcher(nnodes=1, api_outage_budget_s=2, start_timeout_s=2)
    launched = launch_in_dagster(launcher, "standin:ok", instance)
    assert not launched.success
    name = launched.job_name
    assert re.search(
        rf"Could not delete Job {cluster.namespace}/{name} .*suspended it instead", launched.logs
    )
    job = double.objects[("jobs", cluster.namespace, name)]
    assert job["spec"]["suspend"] is True
    deadline = time.monotonic() + 20  # the Job object stays; its pods go
    while (left := cluster.leftovers(name, wait_s=0)).keys() - {
        "job"
    } and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left.keys() == {"job"}, left
    faults.fail_job_deletes = 0
    double.handle(
        "DELETE",
        f"/apis/batch/v1/namespaces/{cluster.namespace}/jobs/{name}",
        {},
        {},
        "finetune-assets-tests",
    )


def test_the_api_wrapper_gives_up_after_the_budget_and_never_retries_a_client_error() -> None:
    attempts = []

    def unavailable(**_):
        attempts.append(1)
        raise kubernetes.client.ApiException(status=503, reason="ServiceUnavailable")

    with pytest.raises(ApiOutage, match="read job failed for 1s"):
        call(unavailable, budget_s=1.0, what="read job")
    assert 2 <= len(attempts) <= 4  # 0.5 s, then 1 s back-off

    def forbidden(**_):
        attempts.append(1)
        raise kubernetes.client.ApiException(status=403, reason="Forbidden")

    attempts.clear()
    with pytest.raises(kubernetes.client.ApiException):
        call(forbidden, budget_s=5.0, what="list pods")
    assert len(attempts) == 1
