"""The README's first command, measured: majority class, TF-IDF baseline and fine-tuned default
model on the built-in English default set (``builtin:rotten_tomatoes``), and how long the whole
command takes.

    nice -n 10 python benchmarks/quality_default_set.py            # a few minutes on 2 CPU cores

Runs exactly the README's commands in a fresh ``DAGSTER_HOME`` and storage root (a temp folder):
``finetune-assets versions add KEY --source SOURCE``, ``dagster asset materialize --select '*'
--partition KEY`` (``--config-json`` only when ``--finetune-config`` overrides defaults, for
comparing recipes), then ``finetune-assets summary KEY --json``. The scores are the pipeline's own:
the frozen test split of ``tokenized_reviews``, ``baseline_model``'s ``info.json`` (baseline and
majority) and ``finetuned_model``'s ``metrics.json``. Results are merged into
``benchmarks/results/quality_default_set.json`` under ``{source}/{recipe}`` with the wall time, the
training time and the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from finetune_assets.core.sources.builtin_sets import DEFAULT_SOURCE


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, text=True, capture_output=True)


@contextlib.contextmanager
def _existing(path: str):
    Path(path).mkdir(parents=True, exist_ok=True)
    yield path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=DEFAULT_SOURCE)
    parser.add_argument("--key", default="rotten_tomatoes", help="dataset version key")
    parser.add_argument(
        "--finetune-config",
        default=None,
        help="finetuned_model config overrides as JSON, e.g. '{\"lr\": 1e-4}' (default: none)",
    )
    parser.add_argument("--out", default="benchmarks/results/quality_default_set.json")
    parser.add_argument(
        "--workdir",
        default=None,
        help="reuse this folder (DAGSTER_HOME + root) instead of a temp "
        "one: a run killed mid-training resumes from its checkpoint (wall time: this run's part)",
    )
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    overrides = json.loads(args.finetune_config) if args.finetune_config else {}

    with tempfile.TemporaryDirectory() if args.workdir is None else _existing(args.workdir) as tmp:
        env = {
            **os.environ,
            "DAGSTER_HOME": f"{tmp}/dagster_home",
            "FINETUNE_ASSETS_ROOT": f"{tmp}/root",
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        }
        Path(env["DAGSTER_HOME"]).mkdir(exist_ok=True)
        load_before = os.getloadavg()
        started = time.time()
        add = run(["finetune-assets", "versions", "add", args.key, "--source", args.source], env)
        if add.returncode:
            sys.exit(add.stderr)
        materialize = [
            "dagster",
            "asset",
            "materialize",
            "-m",
            "finetune_assets.definitions",
            "--select",
            "*",
            "--partition",
            args.key,
        ]
        if overrides:
            materialize += [
                "--config-json",
                json.dumps({"ops": {"finetuned_model": {"config": overrides}}}),
            ]
        mat = run(materialize, env)
        wall = time.time() - started
        summary = run(["finetune-assets", "summary", args.key, "--json"], env)
        if summary.returncode:
            sys.exit(f"{mat.stderr[-3000:]}\n{summary.stderr}")
        result_summary = json.loads(summary.stdout)
        metrics_files = sorted(
            (Path(env["FINETUNE_ASSETS_ROOT"]) / "finetuned_model" / args.key).rglob("metrics.json")
        )
        train = json.loads(metrics_files[-1].read_text()) if metrics_files else {}
    fin, base, maj = (result_summary.get(k) or {} for k in ("finetuned", "baseline", "majority"))
    result = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(started)),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "device": "cpu",
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "source": args.source,
        "resumed_in": args.workdir,
        "finetune_config_overrides": overrides,
        "materialize_exit_code": mat.returncode,
        "wall_seconds_add_and_materialize": round(wall, 1),
        "train": {
            k: train.get(k)
            for k in ("train_seconds", "samples_seen", "global_step", "samples_per_sec")
        },
        "summary": result_summary,
        "finetuned_minus_baseline_accuracy": (
            round(fin["accuracy"] - base["accuracy"], 4)
            if fin.get("accuracy") is not None and base.get("accuracy") is not None
            else None
        ),
        "finetuned_minus_majority_accuracy": (
            round(fin["accuracy"] - maj["accuracy"], 4)
            if fin.get("accuracy") is not None and maj.get("accuracy") is not None
            else None
        ),
    }
    out = Path(args.out)
    merged = json.loads(out.read_text()) if out.is_file() else {}
    merged[
        f"{args.source}/{json.dumps(overrides, sort_keys=True) if overrides else 'defaults'}"
    ] = result
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if mat.returncode:
        print(mat.stderr[-3000:], file=sys.stderr)


if __name__ == "__main__":
    main()
