"""The data chain *with its checks* inside one memory limit, as one run pod has for all its steps.

    .venv/bin/python benchmarks/data_chain_memory.py [--sizes 900000,2700000] [--limit-mb 2048]
        [--work DIR] [--out benchmarks/results/data_chain_memory.json]

Per size: one CSV of that many real reviews (``scale.make_one_file``: the shared Arabic reviews
copied, copy ``k``'s texts suffixed `` #k``), registered as a dataset version; ``pretrained_model``
(the packaged MiniLM) built first, outside the limit; then ``dagster asset materialize`` of
``raw_reviews``, ``tokenized_reviews`` and ``mds_shards`` for the version, with every check on them
(``raw_reviews_contract``, ``vocabulary_fit``, ``mds_shards_integrity``), the code location's own
executor (a process per step), in one memory cgroup (v1 controller, ``scale.MemoryCgroup``) with a
hard limit for the whole process tree: a step or a check that needs more is OOM-killed and the run
fails. Recorded: whether the run succeeded, every check's verdict, the tree's peak anonymous memory
and working set (sampled every 0.1 s), the limit's hit count, and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from scale import DEFAULT_DATA as DATA  # noqa: E402
from scale import MemoryCgroup, make_one_file  # noqa: E402

CHAIN = "raw_reviews,tokenized_reviews,mds_shards"
VERSION = "big"


def _env(home: Path, root: Path) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DAGSTER_HOME": str(home),
        "FINETUNE_ASSETS_ROOT": str(root),
        "DAGSTER_DISABLE_TELEMETRY": "yes",
    }


def _prepare(home: Path, root: Path, csv: Path) -> None:
    """Version registered and the base model built (outside the limit: shared by every version)."""
    code = f"""
import dagster as dg
from finetune_assets.core.sources import SourceSpec, pin_source
from finetune_assets.defs.versions.register import register_version
from finetune_assets.definitions import build_defs
from finetune_assets.core.io.storage import Storage
instance = dg.DagsterInstance.get()
source = pin_source(SourceSpec(uri={str(csv)!r}))
register_version(instance, Storage({str(root)!r}), {VERSION!r}, source)
defs = build_defs({str(root)!r})
job = defs.resolve_implicit_global_asset_job_def().get_subset(
    asset_selection={{dg.AssetKey("pretrained_model")}}
)
assert job.execute_in_process(instance=instance).success
"""
    subprocess.run([sys.executable, "-c", code], env=_env(home, root), check=True, cwd=REPO)


def run_chain(home: Path, root: Path, limit_mb: int) -> dict:
    cgroup = MemoryCgroup(f"data-chain-{os.getpid()}", limit_mb * 2**20)
    cmd = [
        sys.executable,
        "-m",
        "dagster",
        "asset",
        "materialize",
        "-m",
        "finetune_assets.definitions",
        "--select",
        CHAIN,
        "--partition",
        VERSION,
    ]
    t0 = time.time()
    proc = subprocess.Popen(
        cmd,
        env=_env(home, root),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=cgroup.join,
    )
    peak = {"anon": 0.0, "working_set": 0.0}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            anon, working = cgroup.sample()
            peak["anon"] = max(peak["anon"], anon)
            peak["working_set"] = max(peak["working_set"], working)
            time.sleep(0.1)

    threading.Thread(target=sample, daemon=True).start()
    out, _ = proc.communicate()
    stop.set()
    memory = cgroup.close()
    return {
        "returncode": proc.returncode,
        "wall_s": round(time.time() - t0, 1),
        "peak_anon_mb": round(peak["anon"], 1),
        "peak_working_set_mb": round(peak["working_set"], 1),
        "memory_limit_mb": memory["limit_mb"],
        "limit_hits": memory["failcnt"],
        "oom_killed": "Killed" in out or "signal 9" in out or "SIGKILL" in out,
        "tail": out[-1500:] if proc.returncode else "",
    }


def verdicts(home: Path) -> dict:
    """Every check's latest verdict and the chain's materializations, from the run's instance."""
    code = f"""
import json
import dagster as dg
from finetune_assets.definitions import build_defs
instance = dg.DagsterInstance.get()
graph = build_defs().resolve_asset_graph()
out = {{"checks": {{}}, "materialized": []}}
for key in graph.asset_check_keys:
    if key.asset_key.path[-1] in {CHAIN.split(",")!r}:
        rec = instance.get_latest_asset_check_evaluation_record(key)
        ev = rec.evaluation if rec else None
        out["checks"][key.name] = None if ev is None else ev.passed
for name in {CHAIN.split(",")!r}:
    recs = instance.fetch_materializations(dg.AssetKey(name), limit=1).records
    if recs:
        out["materialized"].append(name)
print("VERDICTS " + json.dumps(out))
"""
    res = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(home, Path(os.environ.get("_ROOT", "."))),
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("VERDICTS ")]
    return json.loads(line[-1][len("VERDICTS ") :]) if line else {"error": res.stderr[-800:]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="900000,2700000")
    parser.add_argument("--limit-mb", type=int, default=2048)
    parser.add_argument("--work", default=None)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/data_chain_memory.json"))
    args = parser.parse_args()
    if not MemoryCgroup.available():
        sys.exit("needs a writable cgroup v1 memory controller (/sys/fs/cgroup/memory)")
    work = Path(args.work or tempfile.mkdtemp(prefix="data-chain-"))
    results = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_at_start": list(os.getloadavg()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "chain": CHAIN + " and their checks, one `dagster asset materialize` (process per step)",
        "runs": [],
    }
    for size in [int(s) for s in args.sizes.split(",")]:
        case = work / f"r{size}"
        home, root = case / "home", case / "storage"
        home.mkdir(parents=True, exist_ok=True)
        root.mkdir(exist_ok=True)
        csv = case / "drop" / "reviews.csv"
        rows = make_one_file(DATA, csv, size)
        _prepare(home, root, csv)
        entry = {"reviews": rows, "csv_mb": round(csv.stat().st_size / 2**20, 1)}
        entry.update(run_chain(home, root, args.limit_mb))
        os.environ["_ROOT"] = str(root)
        entry.update(verdicts(home))
        print(json.dumps(entry), flush=True)
        results["runs"].append(entry)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
