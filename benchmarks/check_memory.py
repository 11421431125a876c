"""What ``raw_reviews_contract`` reads of a big version, in its own memory cgroup: the old way
(whole accepted and rejected tables) against the streamed one (a record batch at a time).

    .venv/bin/python benchmarks/check_memory.py [--sizes 900000,2700000] [--limit-mb 2048]
        [--out benchmarks/results/check_memory.json]

The version: ``raw_reviews`` materialized on the shared Arabic reviews (PROD + ATT + RES2), then its
published ``reviews.parquet`` repeated (texts suffixed `` #k``, row groups as ``raw_reviews``
writes them) to each size, with its real ``rejected.parquet``. Each way runs in a child process in
a memory cgroup (v1, ``scale.MemoryCgroup``) with a hard limit: a reader that needs more is
OOM-killed. Recorded: the tree's peak anonymous memory, the exit, and the counts each way found
(they must agree). The full data chain at these sizes (``benchmarks/data_chain_memory.py``) needs
more CPU time than this shared machine has: it is committed for a quieter machine.
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
from scale import DEFAULT_DATA, MemoryCgroup  # noqa: E402

ROW_GROUP = 16384  # raw_reviews' batch_rows


def make_version(work: Path, rows: int) -> Path:
    """An attempt folder: ``rows`` accepted reviews (real, repeated) and the real quarantine."""
    import dagster as dg
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from finetune_assets.core.io.contracts import REJECTED_FILE, REVIEWS_FILE
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.core.sources import SourceSpec
    from finetune_assets.defs.data.raw import raw_reviews
    from finetune_assets.defs.resources.storage_root import StorageResource
    from finetune_assets.defs.versions.register import register_version

    seed = work / "seed"
    if not seed.exists():
        root = work / "seed-root"
        root.mkdir(parents=True, exist_ok=True)
        (work / "seed-home").mkdir(exist_ok=True)
        with dg.instance_for_test(temp_dir=str(work / "seed-home")) as instance:
            register_version(instance, Storage(str(root)), "v", SourceSpec(uri=str(DEFAULT_DATA)))
            assert dg.materialize(
                [raw_reviews],
                partition_key="v",
                instance=instance,
                resources={"storage": StorageResource(root=str(root))},
            ).success
        published = Path(Storage(str(root)).require("raw_reviews", "v").url)
        seed.mkdir()
        for name in (REVIEWS_FILE, REJECTED_FILE):
            (seed / name).write_bytes((published / name).read_bytes())
    out = work / f"r{rows}"
    if (out / REVIEWS_FILE).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    base = pq.read_table(seed / REVIEWS_FILE)
    written, k = 0, 0
    with pq.ParquetWriter(out / REVIEWS_FILE, base.schema, compression="zstd") as w:
        while written < rows:
            part = base.slice(0, rows - written)
            texts = pc.binary_join_element_wise(part.column("text"), pa.scalar(f" #{k}"), "")
            part = part.set_column(part.schema.get_field_index("text"), "text", texts)
            w.write_table(part, row_group_size=ROW_GROUP)
            written, k = written + part.num_rows, k + 1
    (out / REJECTED_FILE).write_bytes((seed / REJECTED_FILE).read_bytes())
    return out


def _child(way: str, attempt: str) -> None:
    from collections import Counter

    from finetune_assets.core.io.contracts import REJECTED_FILE, REVIEWS_FILE

    # Both ways import the check's module (dagster, pyarrow, the code location's checks): the same
    # base, so the peaks differ by what each reads.
    from finetune_assets.defs.data.raw_contract import _scan_accepted, _scan_rejected

    if way == "whole":  # what the check did before: both tables whole, then the counts
        from finetune_assets.core.io.contracts import read_rejected, read_reviews

        accepted = read_reviews(attempt)
        rejected = read_rejected(attempt)
        labels = Counter(accepted.column("label").to_pylist())
        found = {"rows": accepted.num_rows + rejected.num_rows, "labels": dict(labels)}
    else:
        accepted = _scan_accepted(f"{attempt}/{REVIEWS_FILE}", None)
        rejected = _scan_rejected(f"{attempt}/{REJECTED_FILE}", None)
        found = {"rows": accepted.rows + rejected.rows, "labels": dict(accepted.labels)}
    print("RESULT " + json.dumps(found, sort_keys=True), flush=True)


def measure(way: str, attempt: Path, limit_mb: int) -> dict:
    cgroup = MemoryCgroup(f"check-memory-{os.getpid()}-{way}", limit_mb * 2**20)
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, __file__, "_child", way, str(attempt)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=cgroup.join,
    )
    peak = [0.0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], cgroup.sample()[0])
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    out, _ = proc.communicate()
    stop.set()
    memory = cgroup.close()
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    return {
        "returncode": proc.returncode,
        "oom_killed": proc.returncode in (-9, 137),
        "peak_anon_mb": round(peak[0], 1),
        "limit_hits": memory["failcnt"],
        "wall_s": round(time.time() - t0, 1),
        "found": json.loads(line[-1][len("RESULT ") :]) if line else None,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        _child(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="900000,2700000")
    parser.add_argument("--limit-mb", type=int, default=2048)
    parser.add_argument("--work", default=None)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/check_memory.json"))
    args = parser.parse_args()
    if not MemoryCgroup.available():
        sys.exit("needs a writable cgroup v1 memory controller (/sys/fs/cgroup/memory)")
    work = Path(args.work or tempfile.mkdtemp(prefix="check-memory-"))
    results = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_avg_at_start": list(os.getloadavg()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared",
        "memory_limit_mb": args.limit_mb,
        "runs": [],
    }
    for size in [int(s) for s in args.sizes.split(",")]:
        attempt = make_version(work, size)
        entry = {"accepted_reviews": size}
        for way in ("whole", "streamed"):
            entry[way] = measure(way, attempt, args.limit_mb)
        done = [entry[w]["found"] for w in ("whole", "streamed") if entry[w]["found"]]
        entry["counts_agree"] = len(done) < 2 or done[0] == done[1]
        print(json.dumps(entry), flush=True)
        results["runs"].append(entry)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
