"""The transcribed upstream Job-controller cases, played against the real Job controller.

Each case of ``upstream_job_cases.py`` (from ``pkg/controller/job/job_controller_test.go``) gives
a Job spec, the pods the controller sees and what one ``syncJob`` pass makes of them. Here the
case's Job is created on the local control plane and the real kube-controller-manager runs it;
its pods, run by the node agents, *play* the case's pods: attempt ``k`` of an index (or the
``k``-th pod of a non-indexed Job) exits with the case pod's exit codes (per container), or
``0`` (``Succeeded``), or holds running (``Running`` / ``Pending``, and every attempt the case does
not list). A pod written with ``failure_count: k`` is the index's attempt ``k`` (earlier attempts
fail). Once every played attempt has run (and, where the case wants a terminal condition, the Job
has one), the Job's status must show what the case asserts:

- ``conditions``: each wanted ``(type, reason, message)`` is among the Job's (pod names in
  messages are the controller's own); none wanted: no ``FailureTarget``/``Failed``/
  ``SuccessCriteriaMet``/``Complete``;
- ``completed_indexes``, ``failed_indexes``, ``succeeded``; ``active`` for a Job still running;
  ``failed`` where the case's pods are all there were (no ``failure_count`` history).

Not comparable after the fact (upstream asserts one pass; the real controller runs many):
``created``, ``deleted``, ``terminating``. Not played (no way to make a real pod so): pods with
conditions (``DisruptionTarget``, ``ResourceLimitExceeded``: eviction, the kubelet), pods being
deleted, init containers; those cases are upstream's own (its CI runs them), not checked here.

All played Jobs are created at once (one namespace, each Job's own state folder) and run together:
the controller's back-off before replacing a failed pod (10 s, then 20 s) dominates.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from finetune_assets_tests.core.launchers.k8s.conftest import Cluster
from finetune_assets_tests.core.launchers.k8s.upstream_job_cases import CASES

pytestmark = [pytest.mark.control_plane, pytest.mark.k8s]

NAMESPACE = "job-cases"
SETTLE_S = 240.0  # a bound on waiting for the controller (back-offs of 10 s + 20 s under load)

# What each pod runs: its attempt number from a shared state folder (pods are processes of one
# host), then the case pod's exit code for this container, or holds (exec sleep).
PLAYER = r"""
import fcntl, json, os, sys
state, container = sys.argv[1], sys.argv[2]
plan = json.load(open(os.path.join(state, "plan.json")))
slot = os.environ.get("JOB_COMPLETION_INDEX", "all")
pod = os.environ["POD_NAME"]
with open(os.path.join(state, "lock"), "a+") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    path = os.path.join(state, "attempts.json")
    seen = json.load(open(path)) if os.path.exists(path) else {}
    if pod not in seen:
        seen[pod] = [slot, sum(1 for s, _ in seen.values() if s == slot)]
        json.dump(seen, open(path + ".tmp", "w"))
        os.replace(path + ".tmp", path)
    attempt = seen[pod][1]
steps = plan.get(slot, [])
step = steps[attempt] if attempt < len(steps) else "hold"
if step == "hold":
    os.execvp("sleep", ["sleep", "3600"])
sys.exit(step.get(container, 0))
"""


def _playable(case: dict) -> bool:
    return not any(
        {"conditions", "deleting", "init_exit_codes"} & extra.keys()
        for _, _, _, extra in case["pods"]
    )


PLAYED = [c for c in CASES if _playable(c)]


def _plan(case: dict) -> tuple[dict[str, list], list[str], bool]:
    """Per slot (completion index, or ``all``): each attempt's exit codes by container, or
    ``hold``; the containers; whether attempts were added for a ``failure_count`` history.
    """
    indexed = case["spec"].get("completionMode") == "Indexed"
    containers: list[str] = []
    for _, _, _, extra in case["pods"]:
        for name in extra.get("exit_codes", {}):
            name = name or "main"
            if name not in containers:
                containers.append(name)
    containers = containers or ["main"]
    plan: dict[str, list] = {}
    filled = False
    for _, index, phase, extra in case["pods"]:
        steps = plan.setdefault(str(index) if indexed else "all", [])
        while len(steps) < extra.get("failure_count", 0):
            steps.append({containers[0]: 1})  # the history a failure_count says there was
            filled = True
        if phase == "Succeeded":
            steps.append({})
        elif phase == "Failed":
            codes = {(k or "main"): v for k, v in extra.get("exit_codes", {}).items()}
            steps.append(codes or {containers[0]: 1})
        else:
            steps.append("hold")
    return plan, containers, filled


def _job(name: str, case: dict, state: Path, containers: list[str]) -> dict[str, Any]:
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            **case["spec"],
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": c,
                            "image": "finetune-assets:test",
                            "command": [sys.executable, "-c", PLAYER, str(state), c],
                            "env": env,
                        }
                        for c in containers
                    ],
                }
            },
        },
    }


@pytest.fixture(scope="module")
def played(k8s_cluster: Cluster, tmp_path_factory) -> dict[str, dict]:
    """Every playable case's Job, created at once: case name -> what the test needs."""
    if k8s_cluster.plane is None:
        pytest.skip("plays the cases on the local control plane's Job controller")
    client = k8s_cluster.plane.api_client()
    core, batch = kubernetes.client.CoreV1Api(client), kubernetes.client.BatchV1Api(client)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except kubernetes.client.ApiException as e:
        if e.status != 409:
            raise
    # the ServiceAccount controller's "default" first: pods without it are refused by admission
    deadline = time.monotonic() + 60
    while not core.list_namespaced_service_account(
        NAMESPACE, field_selector="metadata.name=default"
    ).items:
        assert time.monotonic() < deadline, "no default ServiceAccount"
        time.sleep(0.2)
    root = tmp_path_factory.mktemp("job-cases")
    out = {}
    for i, case in enumerate(PLAYED):
        name = f"case-{i:02d}"
        state = root / name
        state.mkdir()
        plan, containers, filled = _plan(case)
        (state / "plan.json").write_text(json.dumps(plan))
        batch.create_namespaced_job(NAMESPACE, _job(name, case, state, containers))
        out[case["case"]] = {"name": name, "state": state, "plan": plan, "filled": filled}
    yield out
    for info in out.values():
        try:
            batch.delete_namespaced_job(
                info["name"], NAMESPACE, propagation_policy="Background", grace_period_seconds=0
            )
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise


TERMINAL = {"FailureTarget", "Failed", "SuccessCriteriaMet", "Complete"}


def _attempts(info: dict) -> dict[str, tuple[str, int]]:
    """Pod name -> (slot, attempt) of every pod that ran the player so far."""
    path = info["state"] / "attempts.json"
    return {k: tuple(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}


def _played_out(info: dict, pods: dict[str, Any]) -> bool:
    """Every attempt the case lists before its first hold has ended and been counted by the
    controller (its pod terminal, the ``batch.kubernetes.io/job-tracking`` finalizer gone, or the
    pod deleted), and where the case holds, the holding attempt has started.
    """
    seen = _attempts(info)
    for slot, steps in info["plan"].items():
        finite = next((i for i, s in enumerate(steps) if s == "hold"), len(steps))
        mine = {a: name for name, (sl, a) in seen.items() if sl == slot}
        for attempt in range(finite):
            if attempt not in mine:
                return False
            pod = pods.get(mine[attempt])
            if pod is not None and (
                pod.status.phase not in ("Succeeded", "Failed")
                or "batch.kubernetes.io/job-tracking" in (pod.metadata.finalizers or [])
            ):
                return False
        if finite < len(steps) and finite not in mine:
            return False
    return True


def _unlisted_pods(core, info: dict, uid: str) -> int:
    """Pods the controller created that the case does not list (a hold the play added: another
    index's pod, an attempt after the listed ones): upstream's one pass never saw them; a failing
    Job's controller kills them and counts them failed. From the controller's ``SuccessfulCreate``
    events, less the listed attempts that ran.
    """
    events = core.list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.uid={uid},reason=SuccessfulCreate"
    ).items
    created = sum(e.count or 1 for e in events)
    listed = sum(
        1 for slot, attempt in _attempts(info).values() if attempt < len(info["plan"].get(slot, []))
    )
    return created - listed


def _observed(job) -> dict[str, Any]:
    s = job.status
    return {
        "conditions": [(c.type, c.reason, c.message) for c in s.conditions or []],
        "active": s.active or 0,
        "failed": s.failed or 0,
        "succeeded": s.succeeded or 0,
        "completed_indexes": s.completed_indexes or "",
        "failed_indexes": s.failed_indexes or "",
        "uncounted": bool(
            s.uncounted_terminated_pods
            and (s.uncounted_terminated_pods.failed or s.uncounted_terminated_pods.succeeded)
        ),
        "terminating": s.terminating or 0,
    }


def _message_pattern(message: str) -> str:
    """Upstream names pods ``default/<name>``; the controller names them ``<ns>/<job>-...``."""
    return re.sub(r"default/\S+", lambda _: f"{NAMESPACE}/case-\\d+-\\S+", re.escape(message))


@pytest.mark.parametrize("case", PLAYED, ids=[c["case"][:60] for c in PLAYED])
def test_upstream_job_case_on_the_real_controller(cluster: Cluster, played, case: dict) -> None:
    info = played[case["case"]]
    batch = kubernetes.client.BatchV1Api(cluster.plane.api_client())
    want = case["want"]
    wanted = want.get("conditions", [])
    terminal = any(t in ("Failed", "Complete", "Suspended") for t, _, _ in wanted)
    if not terminal and any(t in TERMINAL for t, _, _ in wanted):
        terminal = True  # an interim condition: the real controller goes on to the final one
    deadline = time.monotonic() + SETTLE_S
    core = kubernetes.client.CoreV1Api(cluster.plane.api_client())
    while True:
        job = batch.read_namespaced_job_status(info["name"], NAMESPACE)
        got = _observed(job)
        pods = {
            p.metadata.name: p
            for p in core.list_namespaced_pod(
                NAMESPACE, label_selector=f"job-name={info['name']}"
            ).items
        }
        types = {t for t, _, _ in got["conditions"]}
        if terminal:
            done = bool(types & {"Failed", "Complete", "Suspended"})
        else:
            # settled: every played attempt ran, the held pods run, nothing left uncounted
            done = (
                _played_out(info, pods)
                and not got["uncounted"]
                and got["terminating"] == 0
                and got["active"] == want.get("active", got["active"])
            )
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert done, f"{case['case']}: the Job did not settle within {SETTLE_S:.0f} s: {got}"

    for ctype, reason, message in wanted:
        assert any(
            t == ctype and r == reason and re.fullmatch(_message_pattern(message), m or "")
            for t, r, m in got["conditions"]
        ), f"{case['case']}: no condition {(ctype, reason, message)} in {got['conditions']}"
    if not wanted:
        assert not types & TERMINAL, f"{case['case']}: {got['conditions']}"
    for key in ("completed_indexes", "failed_indexes", "succeeded"):
        if key in want:
            assert got[key] == want[key], f"{case['case']}: {key} {got[key]!r} != {want[key]!r}"
    if "active" in want and not terminal:
        assert got["active"] == want["active"], f"{case['case']}: active {got}"
    if "failed" in want and not info["filled"]:
        extra = _unlisted_pods(core, info, job.metadata.uid) if terminal else 0
        assert got["failed"] == want["failed"] + extra, f"{case['case']}: failed {got} ({extra})"
