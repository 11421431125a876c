"""The data fan-out as a Kubernetes Indexed Job (``K8sFanOutRunner``): manifests offline, 3 pods
on the local plane (the real Job controller decides every retry).

The worker is a few lines of Python that write one part per ``JOB_COMPLETION_INDEX`` through fsspec
under the root its environment names, as the slice workers do; the host filesystem plays the
object-store root (the plane's pods are local processes). How many pods each index got, and how each
ended, comes from a watch on the API server (``Cluster.pod_history``).
"""

from __future__ import annotations

import re
import sys
import threading
from collections import Counter
from pathlib import Path

import kubernetes_validate
import pytest

from finetune_assets.core.launchers.fanout import FanOut, FanOutError
from finetune_assets.core.launchers.k8s import GANG_LABEL, JOB_LABEL
from finetune_assets.core.launchers.k8s.fanout import K8sFanOutRunner, assess_fanout, indexes
from finetune_assets.defs.resources.k8s_launcher import K8sTorchrunLauncher
from finetune_assets_tests.core.launchers.k8s.conftest import Cluster
from finetune_assets_tests.core.launchers.k8s.plane import wait_until
from finetune_assets_tests.core.launchers.k8s.test_launcher_api import (
    LAUNCHER_VERBS,
    launcher_requests,
    verbs,
)
from finetune_assets_tests.core.launchers.k8s.test_manifests import K8S_VERSIONS, SECRET

# One part per index, written atomically (a preempted first pod may leave a .tmp behind, never a
# part). Its attempt k (counted in a file beside the parts) of index i holds until it is killed when
# k < FANOUT_HOLD_<i>, and takes more memory than its limit when k < FANOUT_OOM_<i> (the node agent
# OOM-kills it, as the kernel does at the cgroup limit).
WORKER = """
import os, sys, time, fsspec
i = int(os.environ["JOB_COMPLETION_INDEX"])
root, failing = os.environ["FANOUT_OUT"], sys.argv[1].split(",")
with open(os.path.join(root, f"tries-{i}"), "a+") as tries:
    tries.write("x")
    tries.seek(0)
    attempt = len(tries.read()) - 1
print(f"worker {i} starts (attempt {attempt})", flush=True)
if attempt < int(os.environ.get(f"FANOUT_HOLD_{i}", 0)):
    print(f"worker {i} holds", flush=True)
    time.sleep(600)
if attempt < int(os.environ.get(f"FANOUT_OOM_{i}", 0)):
    hog = b"x" * (3 << 30)
    time.sleep(600)
if str(i) in failing:
    print(f"worker {i}: slice {i} is unreadable", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(0.5)
fs, path = fsspec.core.url_to_fs(f"{root}/part-{i}.txt")
with fs.open(path + ".tmp", "w") as f:
    f.write(f"slice {i} of {os.environ['FANOUT_TOTAL']}\\n")
fs.mv(path + ".tmp", path)
print(f"worker {i} wrote part-{i}.txt", flush=True)
"""
LABELS = {
    "dagster/run-id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
    "dagster/asset": "tokenized_reviews",
    "dagster/partition": "v1",
}


def fanout(out: str, count: int = 3, failing: str = "", **env: str) -> FanOut:
    return FanOut(
        name="tok-v1-0f1e2d3c",
        command=[sys.executable, "-c", WORKER, failing],
        count=count,
        env={"FANOUT_TOTAL": str(count), "FANOUT_OUT": out, **env},
    )


# -- manifests (offline) --------------------------------------------------------------------------


WORKER_POOL = dict(
    worker_node_selector={"pool": "cpu"},
    worker_memory_request="1536Mi",
    worker_memory_limit="2Gi",
    worker_k8s_config={
        "pod_template_spec_metadata": {
            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}
        },
        "pod_spec_config": {"priorityClassName": "batch-low"},
    },
)


def render(launcher_fields: dict | None = None, **runner_fields):
    launcher = K8sTorchrunLauncher(
        image="registry.example.com/finetune-assets:1.0",
        namespace="ml-train",
        nnodes=2,
        gpus_per_node=8,
        env_secret_names=["finetune-s3"],
        service_account_name="finetune-trainer",
        node_selector={"pool": "batch"},
        storage_pvc_name="finetune-storage",
        **(launcher_fields or {}),
    )
    runner = K8sFanOutRunner(launcher, labels=LABELS, **runner_fields)
    return runner, runner.render(fanout("s3://bucket/finetune/slices/tok-v1"), "tok-v1-abc123")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    "fields",
    [{}, {"parallelism": 2, "retries_per_index": 0}, {"launcher_fields": WORKER_POOL}],
    ids=["all-at-once", "2-at-a-time", "own-pool-passthrough"],
)
def test_fanout_manifest_validates(version: str, fields) -> None:
    _, job = render(**fields)
    kubernetes_validate.validate(job, version, strict=True)


def test_fanout_manifest_shape() -> None:
    runner, job = render(parallelism=2, retries_per_index=4)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        spec["completionMode"] == "Indexed"
        and spec["completions"] == 3
        and spec["parallelism"] == 2
    )
    # retry per slice, fail fast after
    assert spec["backoffLimitPerIndex"] == 4 and spec["maxFailedIndexes"] == 0
    # checked whatever backoffLimitPerIndex says (upstream default)
    assert spec["backoffLimit"] == 2**31 - 1
    rules = spec["podFailurePolicy"]["rules"]
    assert [r["action"] for r in rules] == ["Ignore", "Count", "FailIndex"]
    assert rules[0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    # transient I/O (EX_TEMPFAIL) and OOM get retries
    assert rules[1]["onExitCodes"]["values"] == [
        75,
        137,
    ]
    # the training launcher's settings, but no GPU and one process per worker pod; no Service
    assert "nvidia.com/gpu" not in container["resources"]["requests"] and "subdomain" not in pod
    # the GPU pool's node selector is not inherited: CPU workers have their own (none here)
    assert "nodeSelector" not in pod and pod["serviceAccountName"] == "finetune-trainer"
    assert [e["secretRef"]["name"] for e in container["envFrom"]] == ["finetune-s3"]
    assert any(
        v.get("persistentVolumeClaim", {}).get("claimName") == "finetune-storage"
        for v in pod["volumes"]
    )
    assert (
        container["securityContext"]["readOnlyRootFilesystem"] is True
        and pod["automountServiceAccountToken"] is False
    )
    # the local interpreter path becomes the image's python; the index arrives from the Job
    # controller
    assert container["command"][:2] == ["python", "-c"]
    assert {"name": "FANOUT_TOTAL", "value": "3"} in container["env"]
    labels = spec["template"]["metadata"]["labels"]
    assert labels[JOB_LABEL] == "tok-v1-abc123" and labels[GANG_LABEL] == runner.dedupe_key(
        fanout("x")
    )
    assert (
        labels["dagster/asset"] == "tokenized_reviews"
        and labels["app.kubernetes.io/component"] == "finetune-data-worker"
    )


def test_fanout_refuses_credentials_as_plain_env_and_impossible_counts() -> None:
    runner = K8sFanOutRunner(K8sTorchrunLauncher(image="img"))
    job = FanOut(
        name="tok", command=["python", "-c", "pass"], count=1, env={"AWS_SECRET_ACCESS_KEY": SECRET}
    )
    with pytest.raises(ValueError, match="env_secret_names") as err:
        runner.render(job, "tok-1")
    assert SECRET not in str(err.value)
    from finetune_assets.core.shards.slices import (
        WORKER_ENV,  # what every data fan-out sets: switches, not credentials
    )

    runner.render(FanOut(name="tok", command=["python"], count=1, env=dict(WORKER_ENV)), "tok-1")
    for count in (0, 100_001):
        with pytest.raises(ValueError, match="use fewer, larger slices"):
            runner.render(FanOut(name="tok", command=["python"], count=count, env={}), "tok-1")


def test_completed_and_failed_indexes_parse() -> None:
    assert (
        indexes("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
        and indexes(None) == set()
        and indexes("") == set()
    )


# -- 3 pods on the local plane -------------------------------------------------------------------

INDEX = "batch.kubernetes.io/job-completion-index"
# a limit the worker's FANOUT_OOM allocation (3 GiB) exceeds: the launcher's smallest for a worker
# (its 1Gi /dev/shm plus 1Gi for the process)
SMALL_WORKERS = {"worker_memory_request": "256Mi", "worker_memory_limit": "2Gi"}


def run(
    cluster: Cluster, job: FanOut, timeout_s: int = 90, launcher: dict | None = None, **fields
) -> tuple[list[str], str]:
    lines: list[str] = []
    runner = K8sFanOutRunner(
        cluster.launcher(timeout_s=timeout_s, **(launcher or {})), labels=LABELS, **fields
    )
    try:
        runner.run(job, lines.append)
    finally:
        text = "\n".join(lines)
        name = re.search(r"Launching fan-out Job [^/\s]+/(\S+):", text).group(1)
        assert cluster.leftovers(name) == {}, (
            "the Job and its pods are deleted however the fan-out ends"
        )
    return lines, name


def parts(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(out.glob("part-*.txt"))}


def of_job(pods: dict, name: str) -> list:
    return [p for p in pods.values() if (p.metadata.labels or {}).get("job-name") == name]


def attempts(pods: dict, name: str) -> dict[int, int]:
    """Pods the Job controller created per completion index."""
    return dict(Counter(int(p.metadata.annotations[INDEX]) for p in of_job(pods, name)))


def counted(pods: dict, name: str) -> list[int]:
    """Indexes of the Failed pods without ``DisruptionTarget`` (they count against retries)."""
    return sorted(
        int(p.metadata.annotations[INDEX])
        for p in of_job(pods, name)
        if p.status.phase == "Failed"
        and not any(c.type == "DisruptionTarget" for c in p.status.conditions or [])
    )


def when_holding(cluster: Cluster, out: Path, indexes: list[int], then) -> threading.Thread:
    """``then(pods)`` once the first pod of each of ``indexes`` runs and holds (FANOUT_HOLD):
    ``pods`` are their names.
    """
    core, _ = cluster._apis()  # noqa: SLF001 - the harness' clients

    def holding() -> list[str] | None:
        if not all((out / f"tries-{i}").exists() for i in indexes):
            return None
        pods = core.list_namespaced_pod(cluster.namespace).items
        names = [
            p.metadata.name
            for i in indexes
            for p in pods
            if (p.metadata.annotations or {}).get(INDEX) == str(i) and p.status.phase == "Running"
        ]
        return names if len(names) == len(indexes) else None

    thread = threading.Thread(
        target=lambda: then(wait_until(holding, 60, "the holding pods")), daemon=True
    )
    thread.start()
    return thread


def evict(cluster: Cluster, name: str) -> None:
    """The Eviction API (a drain, the autoscaler): ``DisruptionTarget`` EvictionByEvictionAPI."""
    core, _ = cluster._apis()  # noqa: SLF001 - the harness' clients
    core.create_namespaced_pod_eviction(
        name, cluster.namespace, {"metadata": {"name": name, "namespace": cluster.namespace}}
    )


def audit_now() -> str:
    """Now, as the audit log writes its times (RFC 3339, microseconds, UTC)."""
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.k8s
@pytest.mark.slow
def test_three_pods_run_every_index_despite_a_late_pod(
    cluster: Cluster, node_faults, tmp_path
) -> None:
    """Index 2's pod waits for its node: the others finish first; each index writes its own part."""
    node_faults.add("start_delay", namespace=cluster.namespace, labels={INDEX: "2"}, seconds=2.0)
    since = audit_now()
    lines, _ = run(cluster, fanout(str(tmp_path)))
    assert node_faults.left("start_delay") == [0]
    assert parts(tmp_path) == {f"part-{i}.txt": f"slice {i} of 3\n" for i in range(3)}
    text = "\n".join(lines)
    # index 0's log streamed
    assert re.search(r"\[\S+-0-\w{5}\] worker 0 wrote part-0.txt", text), text
    assert "3/3 index(es) succeeded" in text and "all 3 index(es) succeeded" in text
    # deploy/rbac.yaml grants the training launcher's verbs; the fan-out needs no more (what the
    # API server's audit log recorded for the launcher's ServiceAccount meanwhile)
    called = verbs(launcher_requests(cluster, since))
    assert ("create", "jobs") in called and called <= LAUNCHER_VERBS, sorted(called)


@pytest.mark.k8s
def test_a_preempted_and_an_oom_killed_index_are_retried(cluster: Cluster, tmp_path) -> None:
    """Index 1's first pod is evicted (the Eviction API: ``DisruptionTarget``, replaced, not
    counted), index 2's exceeds its memory limit (OOMKilled, counted, retried).
    """
    when_holding(cluster, tmp_path, [1], lambda pods: evict(cluster, pods[0]))
    with cluster.pod_history() as pods:
        lines, name = run(
            cluster,
            fanout(str(tmp_path), FANOUT_HOLD_1="1", FANOUT_OOM_2="1"),
            launcher=SMALL_WORKERS,
            retries_per_index=1,
        )
    assert parts(tmp_path) == {f"part-{i}.txt": f"slice {i} of 3\n" for i in range(3)}
    # the eviction is not counted
    assert attempts(pods, name) == {0: 1, 1: 2, 2: 2} and counted(pods, name) == [2]
    assert re.search(r"index 2: pod \S+ Failed, exit code 137 \(OOMKilled\)", "\n".join(lines)), (
        lines
    )


@pytest.mark.k8s
def test_pods_of_two_indexes_failing_at_once_get_one_replacement_each(
    cluster: Cluster, tmp_path
) -> None:
    """The first pods of both indexes are SIGKILLed together (exit 137: counted, retried): each
    index gets one replacement, as the Job controller's per-Job work queue and creation
    expectations guarantee (a fan-out relies on it: a duplicate would write its part twice).
    """

    def kill_both(names: list[str]) -> None:
        for name in names:
            cluster.kill_pod(name)

    when_holding(cluster, tmp_path, [0, 1], kill_both)
    with cluster.pod_history() as pods:
        _, name = run(
            cluster,
            fanout(str(tmp_path), count=2, FANOUT_HOLD_0="1", FANOUT_HOLD_1="1"),
            retries_per_index=1,
        )
    assert attempts(pods, name) == {0: 2, 1: 2} and counted(pods, name) == [0, 1]
    assert parts(tmp_path) == {f"part-{i}.txt": f"slice {i} of 2\n" for i in range(2)}


@pytest.mark.k8s
@pytest.mark.parametrize(
    ("fault", "says", "pods"),
    [
        # the worker's own error: FailIndex, not retried
        (
            "exit",
            "worker 1: slice 1 is unreadable",
            1,
        ),
        # OOM every time: retried once (retries_per_index=1), then failed
        (
            "oom",
            "exit code 137 (OOMKilled)",
            2,
        ),
    ],
)
def test_an_index_that_keeps_failing_fails_the_fanout_naming_it(
    cluster: Cluster, tmp_path, fault, says, pods
) -> None:
    oom = {"FANOUT_OOM_1": "99"} if fault == "oom" else {}
    with cluster.pod_history() as seen, pytest.raises(FanOutError) as err:
        run(
            cluster,
            fanout(str(tmp_path), failing="1" if fault == "exit" else "", **oom),
            launcher=SMALL_WORKERS,
            retries_per_index=1,
        )
    message = str(err.value)
    assert "failed index(es) [1]" in message and says in message, message
    # its log tail, by index
    assert re.search(r"--- pod \S+-1-\w{5} \(index 1\) Failed", message), message
    name = re.search(r"fan-out Job [^/\s]+/(\S+):", message).group(1)
    assert attempts(seen, name)[1] == pods


@pytest.mark.k8s
def test_a_hung_index_fails_the_fanout_at_the_deadline_naming_it(cluster: Cluster) -> None:
    hang = "import os, time; time.sleep(600 if os.environ['JOB_COMPLETION_INDEX'] == '2' else 0)"
    with pytest.raises(FanOutError) as err:
        run(
            cluster,
            FanOut(name="tok-hang", command=["python", "-c", hang], count=3, env={}),
            timeout_s=3,
        )
    assert "timed out after 3s" in str(err.value) and "unfinished index(es) [2]" in str(
        err.value
    ), str(err.value)


@pytest.mark.k8s
def test_a_retry_deletes_the_live_fanout_job_a_dead_launcher_left(
    cluster: Cluster, tmp_path
) -> None:
    """A run pod died mid fan-out (no owner here: launched from outside the cluster); its retry
    replaces the Job.
    """
    runner = K8sFanOutRunner(cluster.launcher(timeout_s=90), labels=LABELS)
    left = runner.render(
        FanOut(
            name="tok-v1-deadrun",
            command=["python", "-c", "import time; time.sleep(600)"],
            count=3,
            env={},
        ),
        "tok-v1-deadrun-abc123",
    )
    cluster.create_job(left)
    lines, _ = run(cluster, fanout(str(tmp_path)))
    assert any(
        line.startswith(f"Deleting live fan-out Job {cluster.namespace}/tok-v1-deadrun-abc123")
        for line in lines
    )
    assert cluster.leftovers("tok-v1-deadrun-abc123") == {} and len(parts(tmp_path)) == 3


@pytest.mark.k8s
def test_a_fanout_job_of_a_live_dagster_run_is_not_deleted(cluster: Cluster, tmp_path) -> None:
    left = K8sFanOutRunner(
        cluster.launcher(timeout_s=90), labels={**LABELS, "dagster/run-id": "other-run"}
    )
    job = left.render(
        FanOut(
            name="tok-v1-live",
            command=["python", "-c", "import time; time.sleep(600)"],
            count=1,
            env={},
        ),
        "tok-v1-live-abc123",
    )
    cluster.create_job(job)
    runner = K8sFanOutRunner(
        cluster.launcher(), labels=LABELS, run_state={"other-run": "STARTED"}.get
    )
    with pytest.raises(
        FanOutError, match="belongs to Dagster run other-run, which is still STARTED"
    ):
        runner.run(fanout(str(tmp_path)), lambda line: None)
    assert "job" in cluster.leftovers("tok-v1-live-abc123", wait_s=0)
    _, batch = cluster._apis()  # noqa: SLF001 - the harness' clients
    batch.delete_namespaced_job(
        "tok-v1-live-abc123", cluster.namespace, propagation_policy="Background"
    )
    assert cluster.leftovers("tok-v1-live-abc123") == {}


def test_a_slice_workers_transient_io_error_exits_75(monkeypatch, capsys) -> None:
    from types import SimpleNamespace

    from finetune_assets.core.launchers.k8s.failures import TRANSIENT_EXIT_CODE
    from finetune_assets.core.shards import slices

    def store_hiccup(spec, index, log):
        raise ConnectionResetError("Connection reset by peer (object store)")

    monkeypatch.setattr(slices, "read_spec", lambda url: SimpleNamespace(count=2))
    monkeypatch.setattr(slices, "shard_slice", store_hiccup)
    assert (
        slices.main(["work", "--spec", "s3://b/spec.json", "--index", "1"])
        == TRANSIENT_EXIT_CODE
        == 75
    )
    assert "transient I/O error" in capsys.readouterr().err


@pytest.mark.k8s
def test_an_index_exiting_75_is_retried(cluster: Cluster, tmp_path) -> None:
    """EX_TEMPFAIL counts against the index's retries (an object-store 503 among thousands of
    slices) instead of failing it as the worker's own error.
    """
    flaky = (
        "import os, sys, pathlib; i = os.environ['JOB_COMPLETION_INDEX']; "
        f"m = pathlib.Path({str(tmp_path)!r}) / ('tried-' + i); "
        "first = not m.exists(); m.touch(); sys.exit(75 if first and i == '1' else 0)"
    )
    with cluster.pod_history() as pods:
        lines, name = run(
            cluster,
            FanOut(name="tok-flaky", command=["python", "-c", flaky], count=2, env={}),
            retries_per_index=1,
        )
    assert attempts(pods, name) == {0: 1, 1: 2} and counted(pods, name) == [1]
    assert any("index 1: pod" in line and "exit code 75" in line for line in lines), lines


def test_assess_fanout_waits_for_retries_and_fails_on_a_failed_index() -> None:
    from types import SimpleNamespace as NS

    def status(done="", failed=""):
        return NS(conditions=[], completed_indexes=done, failed_indexes=failed)

    def pod(i, phase):
        return NS(
            metadata=NS(
                name=f"j-{i}",
                annotations={"batch.kubernetes.io/job-completion-index": str(i)},
                labels={},
                creation_timestamp=None,
            ),
            status=NS(phase=phase, conditions=[], container_statuses=[]),
        )

    # a failed pod whose index still has retries is not a failure of the fan-out
    assert (
        assess_fanout(
            status("0"), [pod(0, "Succeeded"), pod(1, "Failed"), pod(1, "Running")], 2, 2
        ).kind
        == "running"
    )
    assert assess_fanout(status("0", "1"), [pod(1, "Failed")], 2, 2).why == "index(es) [1] failed"
    assert assess_fanout(status("0-1"), [], 2, 2).kind == "complete"


# -- the 3-pod fan-out produces the same MDS samples as the local run ------------


@pytest.mark.k8s
@pytest.mark.slow
def test_three_pod_fanout_writes_the_same_mds_samples_as_local_workers(
    cluster: Cluster, arabic_reviews, tmp_path, monkeypatch
) -> None:
    """Both stages as the assets run them (``_fan_out``: the real ``python -m
    finetune_assets.core.shards.slices work`` command and ``WORKER_ENV``), once through 2 local
    workers and
    once as 3 pods: the merged MDS samples of every split are the same, in the same order. 120
    validated reviews in 6 row groups, 3 tokenize slices.
    """
    import json

    import pyarrow.parquet as pq
    import tokenizers

    from finetune_assets.core.io.contracts import SPLITS
    from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET
    from finetune_assets.core.launchers.fanout import LocalFanOutRunner, python_module, runner_width
    from finetune_assets.core.prep.pretrained import packaged_model_dir
    from finetune_assets.core.prep.tokenize import token_dtype
    from finetune_assets.core.prep.validate import ValidationRules, validate
    from finetune_assets.core.shards import plan as slice_plan
    from finetune_assets.core.shards import slices
    from finetune_assets.core.sources import SourceSpec, read_source
    from finetune_assets_tests.core.shards.test_slices import _samples

    accepted = validate(
        read_source(SourceSpec(uri=str(arabic_reviews / "PROD.csv"))), ValidationRules()
    ).accepted
    reviews = tmp_path / "reviews.parquet"  # raw_reviews' file: text, label, ..., split
    pq.write_table(accepted.slice(0, 120), reviews, row_group_size=20)
    group_rows = [pq.ParquetFile(reviews).metadata.row_group(i).num_rows for i in range(6)]
    tokenizer_json = Path(packaged_model_dir()) / "tokenizer.json"  # the real WordPiece vocabulary
    vocab = tokenizers.Tokenizer.from_file(str(tokenizer_json)).get_vocab_size()
    # a small version still gets several shard workers
    monkeypatch.setattr(slice_plan, "SHARD_ROWS_PER_WORKER", 1)

    def fan_out(
        runner, kind: str, spec: slices.TokenizeSpec | slices.ShardsSpec, count: int
    ) -> str | None:
        """``assets.tokenized._fan_out`` without Dagster; returns the Kubernetes Job's name
        (None: local).
        """
        slices.write_spec(f"{spec.out}/_work/spec.json", spec)
        job = FanOut(
            name=f"{kind}-v1-0f1e2d3c",
            count=count,
            env=dict(slices.WORKER_ENV),
            command=python_module(
                "finetune_assets.core.shards.slices",
                "work",
                "--spec",
                f"{spec.out}/_work/spec.json",
            ),
        )
        if isinstance(runner, LocalFanOutRunner):
            runner.run(job, print)
            return None
        # checks that the Job and its pods are gone afterwards
        with cluster.pod_history() as pods:
            _, name = run(cluster, job, timeout_s=120)
        tried[name] = attempts(pods, name)
        return name

    merged, samples, tried = {}, {}, {}
    for where, runner in (
        ("local", LocalFanOutRunner(workers=2)),
        ("k8s", K8sFanOutRunner(cluster.launcher(timeout_s=120), labels=LABELS)),
    ):
        width = runner_width(runner)
        plan = slices.plan_slices(group_rows, width or 1, slice_rows=40)
        # locally a multiple of the 2 workers
        assert len(plan) == (4 if where == "local" else 3), plan
        tokens = str(tmp_path / where / "tokenized")
        # as tokenized_reviews groups them
        tok_spec = slices.TokenizeSpec(
            reviews=str(reviews),
            out=tokens,
            slices=plan,
            tokenizer=str(tokenizer_json),
            dtype=token_dtype(vocab).name,
            max_length=64,
            labels=DEFAULT_LABEL_SET.to_dict(),
            batch_size=7,
            groups=slices.group_parts(len(plan), width or len(plan)),
        )
        # 2 processes locally; one pod per slice
        assert tok_spec.count == (2 if where == "local" else 3)
        tok_job = fan_out(runner, "tok", tok_spec, tok_spec.count)
        rows = sum(p["rows"] for p in slices.read_part_stats(tokens, len(plan)))
        assert rows == 120, f"{where}: {rows} rows tokenized"
        if tok_job is not None:  # one pod per slice really ran, each once
            assert tried[tok_job] == {0: 1, 1: 1, 2: 1}
        shards = tmp_path / where / "mds"
        groups = slices.group_parts(len(plan), width or len(plan), rows)
        # other slicings and groupings, the same samples
        assert len(groups) == (2 if where == "local" else 3), groups
        fan_out(
            runner,
            "mds",
            slices.ShardsSpec(tokens=tokens, out=str(shards), groups=groups, size_limit=1 << 12),
            len(groups),
        )
        merged[where] = slices.merge_shards(str(shards), shards, len(plan))
        samples[where] = {split: _samples(shards / split) for split in SPLITS}
        assert all(samples[where][s] for s in SPLITS), {
            s: len(v) for s, v in samples[where].items()
        }
        assert {s: len(v) for s, v in samples[where].items()} == {
            s: m["samples"] for s, m in merged[where].items()
        }
        assert all(
            "/" in s["zip_data"]["basename"]
            for split in SPLITS
            for s in json.loads((shards / split / "index.json").read_text())["shards"]
        )
    assert samples["k8s"] == samples["local"]
    assert {s: (m["samples"], m["label_counts"]) for s, m in merged["k8s"].items()} == {
        s: (m["samples"], m["label_counts"]) for s, m in merged["local"].items()
    }
