"""Filesystem calls and seconds of the landing sensor over N registered folders on ``memory://``.

Counts the listing calls one tick makes once every folder is registered (what each 30-second tick
costs forever after; on S3/GCS each call is a network round trip). Run it against another checkout
with ``PYTHONPATH=/path/to/checkout`` to compare. Writes ``benchmarks/results/sensor_tick.json``.

    .venv/bin/python benchmarks/sensor_tick.py --folders 500
"""

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import dagster as dg
import fsspec
from fsspec.implementations.memory import MemoryFileSystem

from finetune_assets.core.io.storage import Storage
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.landing import LandingZoneResource
from finetune_assets.defs.versions.landing_sensor import evaluate_landing

CALLS = ("ls", "find", "open", "info", "exists")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--folders", type=int, default=500)
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "sensor_tick.json")
    )
    args = parser.parse_args()
    fs = fsspec.filesystem("memory")
    for i in range(args.folders):
        fs.pipe(f"/bench/v{i:05d}/reviews.csv", b"text,label\ngood,1\n" * 100)
        fs.pipe(f"/bench/v{i:05d}/_SUCCESS", b"")
    root = tempfile.mkdtemp()
    with Storage(root).publish("pretrained_model") as staging:
        (staging.local_dir / "x").write_text("x")
        staging.data_version = "base"
    calls = dict.fromkeys(CALLS, 0)
    for name in CALLS:
        original = getattr(MemoryFileSystem, name)

        def counted(self, *a, _original=original, _name=name, **k):
            calls[_name] += 1
            return _original(self, *a, **k)

        setattr(MemoryFileSystem, name, counted)
    landing, storage = LandingZoneResource(url="memory:///bench"), StorageResource(root=root)
    with dg.instance_for_test() as instance:
        cursor, ticks, start = None, 0, time.perf_counter()
        while True:
            ticks += 1
            result = evaluate_landing(
                dg.build_sensor_context(instance=instance, cursor=cursor), landing, storage
            )
            for req in result.dynamic_partitions_requests or []:
                instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
            cursor = result.cursor
            if not result.dynamic_partitions_requests:
                break
        registration_s = time.perf_counter() - start
        calls.update(dict.fromkeys(CALLS, 0))
        start = time.perf_counter()
        evaluate_landing(
            dg.build_sensor_context(instance=instance, cursor=cursor), landing, storage
        )
        steady_s = time.perf_counter() - start
    result = {
        "folders": args.folders,
        "registration_ticks": ticks,
        "registration_s": round(registration_s, 2),
        "steady_tick_s": round(steady_s, 4),
        "steady_tick_fs_calls": calls,
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
        "command": f"python benchmarks/sensor_tick.py --folders {args.folders}",
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
