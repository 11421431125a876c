"""Scale benchmark (issue 15): raw_reviews / tokenized_reviews / mds_shards on versions of 0.1M ..
5M reviews.

    .venv/bin/python benchmarks/scale.py [--sizes 100000,1000000,5000000] [--workers 2,1]
        [--incremental 1000000] [--delta 1000000] [--work DIR] [--out benchmarks/results/scale.json]

Versions: the shared Arabic reviews (``../shared/data/arabic_reviews``: PROD + ATT + RES2, 9,068
rows) copied until the size is reached, every text of copy ``k`` suffixed with `` #k`` (so no copy
duplicates another), one CSV file per copy in a version folder (a version grows by adding files).
The "+5%" version is the 1M (else the largest) version plus 5% more copies, materialized after it:
its shared rows come from the token cache.

Each step is materialized through the real code location (``build_defs`` + ``dg.materialize``) in
its own child process, inside its own memory cgroup with a hard 2 GiB limit (``--memory-limit-mb``),
as a pod's container would be: a step that needs more is OOM-killed and the benchmark fails. Memory
figures, sampled every 0.1 s: ``peak_anon_mb``, the anonymous memory of the child and all its slice
workers, each page counted once (what the code holds, the figure that must not grow with the
version); ``peak_working_set_mb`` (usage minus inactive page cache: what the kubelet evicts on);
``peak_rss_mb``, the sum of the processes' RSS (an over-count: shared libraries count once per
process). ``wall_s`` is the step's materialization time inside the child (Dagster start-up
excluded). Before each full tokenization the token cache is emptied (a cold run), so 1 vs 2 workers
compare like for like; ``load_avg`` is the 1-minute load average when the step started;
``cpu_s_incl_startup`` is the CPU time of the child and all its workers, Python and Dagster start-up
included. ``invariants``: rows in = accepted + rejected, and no review changed split against the
smallest version. ``worker_vs_tokenizer_cpu``: one slice worker's CPU time against the fast
tokenizer alone on the same 100k texts (the 1.2x target). ``--delta SIZES``: the same CSV copies
written as one Delta table (``deltalake``, streamed), ``raw_reviews`` read from ``delta:TABLE``
under the same limit, then ``raw_reviews`` of the CSV folder itself (same run, same limit): both in
its entry (``delta``), with their ratios.

``--one-big-file``: the other shape users export, the same copies written into *one* CSV (multi-line
reviews, a distinct suffix per copy), ``raw_reviews`` only, per size: ``one_big_file`` in the
results, with ``peak_anon_mb_largest_vs_smallest`` (the target: within 1.2x from 0.1M to 5M rows,
under 1 GiB).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_DATA = Path("/work/shared/data/arabic_reviews")
STEPS = ("raw_reviews", "tokenized_reviews", "mds_shards")


def make_version(data: Path, folder: Path, rows: int, first_copy: int = 0) -> int:
    """CSV copies of the shared reviews (texts suffixed ``#k``) until ``rows``; returns the rows
    written.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    from finetune_assets.core.sources import SourceSpec, read_source

    raw = read_source(SourceSpec(uri=str(data)))
    base = raw.filter(pc.is_null(raw.column("malformed"))).select(["text", "label"])
    folder.mkdir(parents=True, exist_ok=True)
    written, k = 0, first_copy
    while written < rows:
        part = base.slice(0, rows - written)
        texts = pc.binary_join_element_wise(part.column("text"), pa.scalar(f" #{k}"), "")
        pacsv.write_csv(
            pa.table({"text": texts, "label": part.column("label")}), folder / f"copy-{k:05d}.csv"
        )
        written += part.num_rows
        k += 1
    (folder / "_SUCCESS").touch()
    return written


def make_delta_table(csv_folder: Path, table: Path) -> int:
    """A version's CSV copies as one Delta table, written from a stream of batches (one commit)."""
    import pyarrow.csv as pacsv
    import pyarrow.dataset as pds
    from deltalake import DeltaTable, write_deltalake

    files = sorted(str(f) for f in csv_folder.glob("copy-*.csv"))
    csv = pds.CsvFileFormat(parse_options=pacsv.ParseOptions(newlines_in_values=True))
    batches = pds.dataset(files, format=csv).scanner(batch_size=65_536).to_reader()
    write_deltalake(table, batches, mode="overwrite")
    return DeltaTable(table).version()


def delta_row(step, args, base_root: Path, size: int, results: dict) -> dict:
    """raw_reviews of a ``size``-row Delta table, then of the CSV folder it was written from."""
    source = args.work / "sources" / f"r{size}"
    if not (source / "_SUCCESS").exists():
        shutil.rmtree(source, ignore_errors=True)
        make_version(args.data, source, size)
    table = args.work / "delta" / f"r{size}"
    if not (table / "_delta_log").exists():
        make_delta_table(source, table)
    root = args.work / f"root-delta-{size}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    os.symlink(base_root / "pretrained_model", root / "pretrained_model")
    raw = step(root, f"d{size}", f"delta:{table}", "raw_reviews", {})
    entry = {
        "reviews": size,
        "raw_reviews": raw,
        "rows_in_eq_accepted_plus_rejected": raw["rows_in"]
        == raw["row_count"] + raw["rejected_rows"],
    }
    # the CSV folder of the same copies, read in the same run under the same limit
    files = step(root, f"f{size}", source, "raw_reviews", {})
    entry["file_source_raw_reviews"] = files
    entry["same_rows_as_file_source"] = (raw["row_count"], raw["rejected_rows"]) == (
        files["row_count"],
        files["rejected_rows"],
    )
    for figure in ("peak_anon_mb", "peak_rss_mb"):
        if files.get(figure) and raw.get(figure):
            entry[f"{figure}_delta_vs_files"] = round(raw[figure] / files[figure], 2)
    shutil.rmtree(root, ignore_errors=True)
    return entry


def make_one_file(data: Path, path: Path, rows: int) -> int:
    """One CSV of ``rows`` reviews: the shared reviews copied, copy ``k``'s texts suffixed ``
    #k``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    from finetune_assets.core.sources import SourceSpec, read_source

    raw = read_source(SourceSpec(uri=str(data)))
    base = raw.filter(pc.is_null(raw.column("malformed"))).select(["text", "label"])
    path.parent.mkdir(parents=True, exist_ok=True)
    written, k = 0, 0
    with pacsv.CSVWriter(
        path.with_suffix(".tmp"), pa.schema([("text", pa.string()), ("label", pa.string())])
    ) as w:
        while written < rows:
            part = base.slice(0, rows - written)
            texts = pc.binary_join_element_wise(part.column("text"), pa.scalar(f" #{k}"), "")
            w.write_table(pa.table({"text": texts, "label": part.column("label")}))
            written, k = written + part.num_rows, k + 1
    path.with_suffix(".tmp").rename(path)
    return written


def one_big_file(step, data: Path, work: Path, sizes: list[int], results: dict, save) -> None:
    """``raw_reviews`` on one CSV per size (the shape of a user's single export)."""
    entries = {
        e["reviews"]: e for e in results.get("one_big_file", []) if e["reviews"] not in sizes
    }
    for size in sizes:
        source = work / "one-file" / f"reviews-{size}.csv"
        if not source.exists():
            make_one_file(data, source, size)
        root = work / f"root-one-{size}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        raw = step(root, f"one{size}", source, "raw_reviews", {})
        entries[size] = {
            "reviews": size,
            "file_mb": round(source.stat().st_size / 2**20, 1),
            "raw_reviews": raw,
            "rows_in_eq_accepted_plus_rejected": raw["rows_in"]
            == raw["row_count"] + raw["rejected_rows"],
        }
        results["one_big_file"] = [entries[k] for k in sorted(entries)]
        peaks = {k: e["raw_reviews"].get("peak_anon_mb") for k, e in entries.items()}
        if len(peaks) > 1 and all(peaks.values()):
            results["one_big_file_peak_anon_mb_largest_vs_smallest"] = round(
                peaks[max(peaks)] / peaks[min(peaks)], 2
            )
        save()
        shutil.rmtree(root, ignore_errors=True)


def tree_rss_mb(pid: int) -> float:
    """RSS of ``pid`` and all its descendants, from /proc (MiB)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


class MemoryCgroup:
    """A cgroup (v1 memory controller) holding one step's process tree, with a hard limit like a
    pod's.

    The kernel counts each page once for the whole tree, which summing per-process RSS does not
    (shared libraries, torch's among them, count once per process there). ``anon`` is the tree's
    anonymous memory (``total_rss``: what the code holds, what a version's size could grow);
    ``working_set`` is usage minus inactive file cache, the figure the kubelet evicts and OOM-kills
    on. With ``limit_bytes`` the step runs under that limit; the page cache is reclaimed under it, a
    step that needs more anonymous memory is OOM-killed (exit -9), as in a pod.
    """

    def __init__(self, name: str, limit_bytes: int | None):
        own = next(
            ln.split(":", 2)[2]
            for ln in Path("/proc/self/cgroup").read_text().splitlines()
            if ln.split(":")[1] == "memory"
        )
        self.path = Path("/sys/fs/cgroup/memory" + own.rstrip("/")) / name
        self.path.mkdir(exist_ok=True)
        if limit_bytes:
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        self.limit = limit_bytes

    @staticmethod
    def available() -> bool:
        return Path("/sys/fs/cgroup/memory/cgroup.procs").exists() and os.access(
            "/sys/fs/cgroup/memory", os.W_OK
        )

    def join(self) -> None:  # in the child, before exec
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def sample(self) -> tuple[float, float]:
        stat = dict(ln.split() for ln in (self.path / "memory.stat").read_text().splitlines())
        usage = int((self.path / "memory.usage_in_bytes").read_text())
        return int(stat["total_rss"]) / 2**20, (usage - int(stat["total_inactive_file"])) / 2**20

    def close(self) -> dict:
        out = {
            "failcnt": int((self.path / "memory.failcnt").read_text()),
            "limit_mb": (self.limit or 0) // 2**20,
        }
        for _ in range(50):
            try:
                self.path.rmdir()
                break
            except OSError:  # the last processes are still leaving
                time.sleep(0.1)
        return out


def run_step(
    root: Path, version: str, source: Path, step: str, config: dict, limit_bytes: int | None = None
) -> dict:
    """One asset in a child process; wall time from inside it; peak memory of its process tree from
    here: the cgroup's anonymous memory and working set (when cgroups are writable), and the sum of
    RSS.
    """
    import resource

    load = os.getloadavg()[0]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(REPO), "FINETUNE_ASSETS_ROOT": str(root)}
    cgroup = (
        MemoryCgroup(f"scale-bench-{os.getpid()}", limit_bytes)
        if MemoryCgroup.available()
        else None
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "_step",
            str(root),
            version,
            str(source),
            step,
            json.dumps(config),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=cgroup.join if cgroup else None,
    )
    peak = {"rss_sum": 0.0, "anon": 0.0, "working_set": 0.0}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak["rss_sum"] = max(peak["rss_sum"], tree_rss_mb(proc.pid))
            if cgroup is not None:
                anon, working = cgroup.sample()
                peak["anon"], peak["working_set"] = (
                    max(peak["anon"], anon),
                    max(peak["working_set"], working),
                )
            time.sleep(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, _ = proc.communicate()
    stop.set()
    t.join()
    memory = cgroup.close() if cgroup is not None else {}
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        killed = " (killed: over its memory limit?)" if proc.returncode in (-9, 137) else ""
        raise RuntimeError(f"{step} failed{killed}: {memory}\n{out[-4000:]}")
    result = json.loads(line[-1][len("RESULT ") :])
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child and every worker it waited for
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    result.update(
        peak_rss_mb=round(peak["rss_sum"], 1),
        cpu_s_incl_startup=round(cpu, 1),
        load_avg=round(load, 2),
    )
    if cgroup is not None:
        result.update(
            peak_anon_mb=round(peak["anon"], 1),
            peak_working_set_mb=round(peak["working_set"], 1),
            memory_limit_mb=memory["limit_mb"],
            limit_hits=memory["failcnt"],
        )
    print(f"  {step} {config}: {result}", flush=True)
    return result


def _step(root: str, version: str, source: str, step: str, config: str) -> None:
    import dagster as dg

    from finetune_assets.core.io.storage import Storage
    from finetune_assets.core.sources import SourceSpec, pin_source
    from finetune_assets.definitions import build_defs
    from finetune_assets.defs.versions.register import read_version, register_version

    defs = build_defs(root)
    instance = dg.DagsterInstance.ephemeral()
    store = Storage(root)
    if step != "pretrained_model":
        if read_version(store, version) is None:
            register_version(instance, store, version, pin_source(SourceSpec(uri=source)))
        else:
            instance.add_dynamic_partitions("dataset_versions", [version])
    assets = [a for a in defs.assets if isinstance(a, dg.AssetsDefinition)]
    t0 = time.perf_counter()
    result = dg.materialize(
        assets,
        selection=[step],
        instance=instance,
        resources=dict(defs.resources),
        partition_key=None if step == "pretrained_model" else version,
        run_config={"ops": {step: {"config": json.loads(config)}}},
    )
    wall = time.perf_counter() - t0
    meta = {}
    for event in result.get_asset_materialization_events():
        for k, v in event.materialization.metadata.items():
            if k in (
                "dagster/row_count",
                "rows_in",
                "reused_rows",
                "new_rows",
                "slices",
                "rejected_rows",
                "shards",
                "token_cache_index_rows",
            ):
                meta[k.replace("dagster/", "")] = v.value
    print("RESULT " + json.dumps({"wall_s": round(wall, 2), **meta}), flush=True)


def invariants(root: Path, version: str, raw_step: dict, reference: Path) -> dict:
    """What must hold at every size: rows in = accepted + rejected, and each review's split is the
    one it had in the smallest version (joined on the text; the first call writes the reference).
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from finetune_assets.core.io.storage import Storage

    out = {
        "rows_in_eq_accepted_plus_rejected": raw_step["rows_in"]
        == raw_step["row_count"] + raw_step["rejected_rows"]
    }
    raw = Storage(str(root)).require("raw_reviews", version)
    table = pq.read_table(f"{raw.url}/reviews.parquet", columns=["text", "split"])
    table = table.set_column(1, "split", table.column("split").cast("string"))
    if not reference.exists():
        pq.write_table(table, reference)
        return out
    joined = pq.read_table(reference).join(table, "text", join_type="inner", right_suffix="_here")
    out["reviews_compared_with_smallest_version"] = joined.num_rows
    out["split_changes"] = int(
        pc.sum(pc.not_equal(joined.column("split"), joined.column("split_here"))).as_py() or 0
    )
    return out


def _encode_all(backend, texts: list[str], method: str, clock=time.perf_counter) -> float:
    encode = getattr(backend, method)
    t0 = clock()
    for i in range(0, len(texts), 2048):
        encode(texts[i : i + 2048])
    return clock() - t0


def tokenizer_alone(root: Path, version: str, limit: int = 100_000) -> dict:
    """The fast tokenizer's own single-thread rate on the version's accepted texts (the 1.2x
    reference): ``encode_batch`` and ``encode_batch_fast`` (no character offsets, what the workers
    call); the faster counts.
    """
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from finetune_assets.core.io.storage import Storage

    store = Storage(str(root))
    raw = store.require("raw_reviews", version)
    texts = (
        pq.read_table(f"{raw.url}/reviews.parquet", columns=["text"])
        .column("text")
        .to_pylist()[:limit]
    )
    model = store.require("pretrained_model")
    backend = AutoTokenizer.from_pretrained(model.url, use_fast=True).backend_tokenizer
    backend.no_truncation()
    backend.no_padding()
    seconds = {m: _encode_all(backend, texts, m) for m in ("encode_batch", "encode_batch_fast")}
    fastest = min(seconds.values())
    return {
        "rows": len(texts),
        **{f"{m}_s": round(v, 2) for m, v in seconds.items()},
        "reviews_per_s": round(len(texts) / fastest),
    }


def worker_vs_tokenizer_cpu(reviews: Path, rows: int = 100_000, repeats: int = 3) -> dict:
    """CPU seconds of one slice worker (``tokenize_slice``, cold cache) vs the fast tokenizer alone
    on the same texts (the faster of ``encode_batch`` / ``encode_batch_fast``), in this process: the
    worker's own overhead (reading, hashing, truncation, Arrow, the cache), whatever the machine's
    load.
    """
    import tempfile

    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET
    from finetune_assets.core.prep.pretrained import packaged_model_dir
    from finetune_assets.core.prep.tokenize import token_dtype
    from finetune_assets.core.shards import slices

    tok = AutoTokenizer.from_pretrained(packaged_model_dir(), use_fast=True)
    backend = tok.backend_tokenizer
    backend.no_truncation()
    backend.no_padding()
    with tempfile.TemporaryDirectory() as tmp:
        table = pq.read_table(reviews).slice(0, rows)
        pq.write_table(table, f"{tmp}/r.parquet", row_group_size=16_384)
        (Path(tmp) / "tok.json").write_text(backend.to_str())
        texts = table.column("text").to_pylist()
        groups = pq.ParquetFile(f"{tmp}/r.parquet").metadata.num_row_groups
        alone: dict[str, float] = {}
        worker = float("inf")
        # interleaved, best of each: the other core's work shifts every figure
        for attempt in range(repeats):
            for m in ("encode_batch", "encode_batch_fast"):
                alone[m] = min(
                    alone.get(m, float("inf")), _encode_all(backend, texts, m, time.process_time)
                )
            spec = slices.TokenizeSpec(
                reviews=f"{tmp}/r.parquet",
                out=f"{tmp}/out",
                slices=[[0, groups]],
                tokenizer=f"{tmp}/tok.json",
                dtype=token_dtype(len(tok)).name,
                max_length=512,
                labels=DEFAULT_LABEL_SET.to_dict(),
                cache=f"{tmp}/cache-{attempt}",
            )
            c0 = time.process_time()
            # a cold cache each time: every row tokenized
            slices.tokenize_slice(spec, 0, log=lambda m: None)
            worker = min(worker, time.process_time() - c0)
    fastest = min(alone.values())
    return {
        "rows": len(texts),
        "best_of": repeats,
        **{f"tokenizer_{m}_cpu_s": round(v, 2) for m, v in alone.items()},
        "slice_worker_cpu_s": round(worker, 2),
        "worker_vs_tokenizer": round(worker / fastest, 2),
        "tokenizer_alone_reviews_per_cpu_s": round(len(texts) / fastest),
        "load_avg": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,1000000,5000000")
    parser.add_argument("--workers", default="1,2", help="worker counts, in the order they run")
    parser.add_argument(
        "--incremental",
        default="",
        help="sizes that also get the +5%% version (after the "
        "first worker count's full run, with that count)",
    )
    parser.add_argument(
        "--delta", default="", help="sizes whose raw_reviews is also read from a Delta table"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--work", type=Path, default=Path("/tmp/scale-bench"))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scale.json")
    parser.add_argument(
        "--one-big-file", action="store_true", help="raw_reviews on one CSV per size instead"
    )
    parser.add_argument(
        "--memory-limit-mb",
        type=int,
        default=2048,
        help="each step runs in a memory cgroup with this hard limit, as in a pod (0: none)",
    )
    args = parser.parse_args()
    step = functools.partial(run_step, limit_bytes=args.memory_limit_mb * 2**20 or None)
    os.environ["TOKENIZERS_PARALLELISM"] = (
        "false"  # one core per process: the workers are the parallelism
    )
    sizes = [int(s) for s in args.sizes.split(",") if s]
    workers = [int(w) for w in args.workers.split(",")]
    incremental_sizes = {int(s) for s in args.incremental.split(",") if s}
    # results of earlier invocations (other sizes) are kept; an entry of a size measured again is
    # replaced
    results: dict = {"versions": [], "incremental": []}
    if args.out.exists():
        results.update(json.loads(args.out.read_text()))
    results["machine"] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
    }
    results.setdefault("runs", []).append(
        {
            "command": "python benchmarks/scale.py " + " ".join(sys.argv[1:]),
            "nice": os.nice(0),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        }
    )
    if args.one_big_file:

        def save_one():
            results["load_avg_at_last_save"] = [round(x, 2) for x in os.getloadavg()]
            args.out.write_text(json.dumps(results, indent=2) + "\n")

        one_big_file(step, args.data, args.work, sizes, results, save_one)
        return
    results["versions"] = [e for e in results["versions"] if e["reviews"] not in sizes]
    results["incremental"] = [
        e for e in results.get("incremental", []) if e["reviews_base"] not in incremental_sizes
    ]
    base_root = args.work / "model-root"
    if not (base_root / "pretrained_model").exists():
        step(base_root, "-", Path("-"), "pretrained_model", {})

    def save():
        results["versions"].sort(key=lambda e: e["reviews"])
        for figure in ("peak_rss_mb", "peak_anon_mb", "peak_working_set_mb"):
            peaks = {
                e["reviews"]: e[f"{figure}_max_over_steps"]
                for e in results["versions"]
                if e.get(f"{figure}_max_over_steps")
            }
            if len(peaks) > 1:
                results[f"{figure}_largest_vs_smallest_version"] = round(
                    peaks[max(peaks)] / peaks[min(peaks)], 2
                )
        results["load_avg_at_last_save"] = [round(x, 2) for x in os.getloadavg()]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")

    for size in sizes:
        source = args.work / "sources" / f"r{size}"
        if not (source / "_SUCCESS").exists():
            shutil.rmtree(source, ignore_errors=True)
            make_version(args.data, source, size)
        root = args.work / f"root-{size}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        os.symlink(base_root / "pretrained_model", root / "pretrained_model")
        version = f"r{size}"
        entry: dict = {"reviews": size, "steps": {}}
        results["versions"].append(entry)
        entry["steps"]["raw_reviews"] = step(root, version, source, "raw_reviews", {})
        if "worker_vs_tokenizer_cpu" not in results or size == min(sizes):
            from finetune_assets.core.io.storage import Storage

            reviews = Storage(str(root)).require("raw_reviews", version).url + "/reviews.parquet"
            results["worker_vs_tokenizer_cpu"] = worker_vs_tokenizer_cpu(Path(reviews))
        if size == min(sizes):
            (args.work / "splits-reference.parquet").unlink(missing_ok=True)
        entry["invariants"] = invariants(
            root, version, entry["steps"]["raw_reviews"], args.work / "splits-reference.parquet"
        )
        save()
        for n, w in enumerate(workers):
            shutil.rmtree(root / "token_cache", ignore_errors=True)  # cold cache: a full run
            tok = step(root, version, source, "tokenized_reviews", {"workers": w})
            mds = step(root, version, source, "mds_shards", {"workers": w})
            rows = tok["row_count"]
            entry["steps"][f"workers_{w}"] = {
                "tokenized_reviews": tok,
                "mds_shards": mds,
                "tokenize_plus_shard_reviews_per_s": round(rows / (tok["wall_s"] + mds["wall_s"])),
                "tokenize_reviews_per_s": round(rows / tok["wall_s"]),
                "tokenize_plus_shard_cpu_s": round(
                    tok["cpu_s_incl_startup"] + mds["cpu_s_incl_startup"], 1
                ),
            }
            for figure in ("peak_rss_mb", "peak_anon_mb", "peak_working_set_mb"):
                entry[f"{figure}_max_over_steps"] = max(
                    [entry["steps"]["raw_reviews"].get(figure, 0)]
                    + [
                        entry["steps"][k][s].get(figure, 0)
                        for k in entry["steps"]
                        if k != "raw_reviews"
                        for s in STEPS[1:]
                    ]
                )
            if {"workers_1", "workers_2"} <= entry["steps"].keys():
                one, two = (
                    entry["steps"][k]["tokenize_plus_shard_reviews_per_s"]
                    for k in ("workers_1", "workers_2")
                )
                entry["speedup_2_vs_1_wall"] = round(two / one, 2)
            if "workers_1" in entry["steps"] and "tokenizer_alone_1_thread" not in entry:
                entry["tokenizer_alone_1_thread"] = tokenizer_alone(root, version)
                entry["tokenizer_alone_vs_tokenize_step_1_worker"] = round(
                    entry["tokenizer_alone_1_thread"]["reviews_per_s"]
                    / entry["steps"]["workers_1"]["tokenize_reviews_per_s"],
                    2,
                )
            save()
            if n == 0 and size in incremental_sizes:
                results["incremental"].append(
                    incremental(
                        step, args.data, args.work, root, source, version, size, w, tok["wall_s"]
                    )
                )
                save()
        shutil.rmtree(root, ignore_errors=True)
    for size in (int(s) for s in args.delta.split(",") if s):
        results["delta"] = [e for e in results.get("delta", []) if e["reviews"] != size]
        results["delta"].append(delta_row(step, args, base_root, size, results))
        save()
    print(json.dumps({k: v for k, v in results.items() if k != "versions"}, indent=2))


def incremental(
    step,
    data: Path,
    work: Path,
    root: Path,
    source: Path,
    version: str,
    size: int,
    w: int,
    full_s: float,
) -> dict:
    """+5% new rows on top of ``version``: its shared rows come from the cache its full run just
    filled.
    """
    more = work / "sources" / f"r{size}-plus5"
    shutil.rmtree(more, ignore_errors=True)
    shutil.copytree(source, more)
    (more / "_SUCCESS").unlink()
    copies = len(list(source.glob("copy-*.csv")))
    make_version(data, more / "new", size // 20, first_copy=copies)
    (more / "new" / "_SUCCESS").unlink()
    plus = f"r{size}-plus5"
    out = {
        "reviews_base": size,
        "reviews": size + size // 20,
        "workers": w,
        "raw_reviews": step(root, plus, more, "raw_reviews", {}),
        "tokenized_reviews": step(root, plus, more, "tokenized_reviews", {"workers": w}),
        "full_run_tokenized_wall_s": full_s,
    }
    out["invariants"] = invariants(
        root, plus, out["raw_reviews"], work / "splits-reference.parquet"
    )
    out["tokenize_time_vs_full_run"] = round(out["tokenized_reviews"]["wall_s"] / full_s, 3)
    shutil.rmtree(more, ignore_errors=True)
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_step":
        _step(*sys.argv[2:])
    # _cpu REVIEWS_PARQUET OUT_JSON: add the CPU comparison
    elif len(sys.argv) > 1 and sys.argv[1] == "_cpu":
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        out = Path(sys.argv[3])
        results = json.loads(out.read_text())
        results["worker_vs_tokenizer_cpu"] = worker_vs_tokenizer_cpu(Path(sys.argv[2]))
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(results["worker_vs_tokenizer_cpu"])
    else:
        main()
