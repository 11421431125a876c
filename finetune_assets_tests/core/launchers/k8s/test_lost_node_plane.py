"""A node lost mid-training never leaves two gangs writing one checkpoint (the real plane).

The node agent hosting rank 0 is stopped (SIGSTOP): the node stops reporting, its pod processes
keep running, exactly a partitioned node. The real node lifecycle controller marks it NotReady;
the test then does what an admin does after confirming the machine is down (non-graceful node
shutdown): the ``node.kubernetes.io/out-of-service`` taint, upon which the real taint manager
evicts the pods (``DisruptionTarget``) and the real PodGC deletes them. The launcher resubmits a
fresh gang only when every pod of the gang key is gone; the old rank 0 is still alive then, and
its next commit is refused by the fence the new gang raised
(``core/training/checkpoints/fencing.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading

import kubernetes
import pytest

from finetune_assets_tests.core.launchers.k8s.helpers import launch_in_dagster
from finetune_assets_tests.core.launchers.k8s.plane_objects import (
    apis,
    cluster_in,
    namespace,
    wait_for,
)

# slow (about 2.5 min): the real node lifecycle controller marks a silent node NotReady only after
# its node-monitor-grace-period (upstream default 50 s), and the test waits for that on purpose
pytestmark = [pytest.mark.control_plane, pytest.mark.slow]

GANG_STANDIN = "finetune_assets_tests.core.launchers.k8s.gang_standin"
OUT_OF_SERVICE = {
    "key": "node.kubernetes.io/out-of-service",
    "value": "nodeshutdown",
    "effect": "NoExecute",
}


def ready(core, node: str) -> bool:
    conds = core.read_node(node).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conds)


def set_taints(core, node: str, taints: list[dict]) -> None:
    core.patch_node(node, {"spec": {"taints": taints or None}})


def test_a_stale_rank_on_a_lost_node_cannot_commit_over_the_new_gang(
    control_plane, instance, tmp_path
) -> None:
    ns = namespace(control_plane, "lost-node")
    core, _, _ = apis(control_plane)
    launcher = cluster_in(control_plane, ns).launcher(
        trainer_module=GANG_STANDIN,
        nnodes=1,  # torchrun --standalone: its own free port (the plane's pods share one port
        # space, and the stale gang's c10d store keeps its port)
        max_resubmissions=1,
        timeout_s=900,
        poll_interval_s=1,
    )
    out: list = []
    thread = threading.Thread(
        target=lambda: out.append(
            launch_in_dagster(launcher, f"standin:train=700,step_s=0.2,dir={tmp_path}", instance)
        ),
        daemon=True,
    )
    thread.start()
    journal = tmp_path / "journal"
    wait_for(
        "rank 0 to commit step 3", lambda: journal.exists() and "step=3" in journal.read_text()
    )
    pod0 = next(
        p
        for p in core.list_namespaced_pod(ns).items
        if p.metadata.labels.get("batch.kubernetes.io/job-completion-index") == "0"
        and p.status.phase == "Running"
    )
    node = pod0.spec.node_name  # fa-node-<i>, whose agent's pid file is node-<i>
    agent = control_plane.pids()[node.removeprefix("fa-")]
    os.kill(agent, signal.SIGSTOP)
    try:
        wait_for(f"{node} NotReady", lambda: not ready(core, node), 180, every=2)
        set_taints(core, node, [OUT_OF_SERVICE])  # the admin: "that machine is off"
        thread.join(timeout=600)
    finally:
        os.kill(agent, signal.SIGCONT)
        with contextlib.suppress(kubernetes.client.ApiException):
            set_taints(core, node, [])
        wait_for(f"{node} Ready again", lambda: ready(core, node), 120, every=2)
    assert out, "the launch did not return"
    launched = out[0]
    assert launched.success, launched.logs[-6000:]
    assert "resubmitting the gang (1/1)" in launched.logs
    lines = journal.read_text().splitlines()
    gens = [int(g) for g in re.findall(r"generation=(\d+)", "\n".join(lines))]
    old, new = gens[0], gens[-1]
    assert new > old
    # the stale rank kept running after the new gang took over: its next commit was refused
    # (the new gang raised the fence before its first commit), and none was accepted after that
    refused = [i for i, line in enumerate(lines) if line.startswith(f"refused generation={old}")]
    assert refused, lines[-20:]
    after = lines[refused[0] :]
    assert not any(line.startswith(f"accepted generation={old}") for line in after), after[:20]
    assert f'"generation": {new}' in (tmp_path / "fence.json").read_text()
    # the new gang resumed from the old gang's last accepted step and trained to the end
    resumed = int(re.findall(r"rank=0 generation=\d+ resumes at step (\d+)", launched.logs)[-1])
    last_old = max(
        int(s) for s in re.findall(rf"accepted generation={old} step=(\d+)", "\n".join(lines))
    )
    assert resumed == last_old
    assert "trained global_step=700" in launched.logs
