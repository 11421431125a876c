"""Tuning, measured: a ``tuning_study`` on the default English version, then ``finetuned_model``
trained with the best trial's parameters, against the default recipe's test macro-F1.

    python benchmarks/tuning.py --workdir /tmp/tuning-bench   # ~35 minutes on 2 quiet CPU cores

Runs the README's commands in ``--workdir`` (``DAGSTER_HOME`` + storage root; kept, so a killed run
continues the same study): ``finetune-assets versions add``, the upstream assets, ``tuning_study``
(``--study-config`` overrides its defaults), ``finetuned_model`` with ``hyper_parameters_from:
study``, then ``finetuned_model`` with its defaults (the default recipe, re-measured on the same
version, splits and machine; ``--recorded-default`` reads the score recorded by
``benchmarks/quality_default_set.py`` instead).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from finetune_assets.data.builtin import DEFAULT_SOURCE
from finetune_assets.tuning.space import TuningConfig

DEFAULT_RESULT = "benchmarks/results/quality_default_set.json"
TRIAL_FIELDS = ("number", "state", "value", "reports", "pruned_at_step", "seconds", "params")


def run(cmd: list[str], env: dict[str, str]) -> float:
    print("$", " ".join(cmd), flush=True)
    t = time.time()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True)
    if proc.returncode:
        sys.exit(f"exit {proc.returncode}\n{proc.stderr[-4000:]}")
    return round(time.time() - t, 1)


def materialize(select: str, key: str, env: dict[str, str], config: dict | None = None) -> float:
    cmd = [
        "dagster",
        "asset",
        "materialize",
        "-m",
        "finetune_assets.definitions",
        "--select",
        select,
        "--partition",
        key,
    ]
    if config:
        cmd += ["--config-json", json.dumps({"ops": config})]
    return run(cmd, env)


def latest(root: Path, asset: str, key: str, name: str) -> dict:
    pointer = (
        json.loads((root / asset / key / "CURRENT").read_text())
        if (root / asset / key / "CURRENT").exists()
        else None
    )
    files = sorted((root / asset / key).rglob(name), key=lambda p: p.stat().st_mtime)
    if pointer:
        files = [f for f in files if pointer["attempt"] in str(f)] or files
    return json.loads(files[-1].read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=DEFAULT_SOURCE)
    parser.add_argument("--key", default="rotten_tomatoes")
    parser.add_argument("--workdir", required=True)
    parser.add_argument(
        "--study-config", default="{}", help="tuning_study config overrides as JSON"
    )
    parser.add_argument("--note", default="")
    parser.add_argument(
        "--study-only", action="store_true", help="stop after the study (no final model)"
    )
    parser.add_argument(
        "--recorded-default",
        action="store_true",
        help=f"the default recipe's score from {DEFAULT_RESULT} instead of training it here",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="materialize nothing: write the result from what --workdir already holds",
    )
    parser.add_argument("--out", default="benchmarks/results/tuning.json")
    args = parser.parse_args()
    study_config = json.loads(args.study_config)
    work = Path(args.workdir)
    (work / "dagster_home").mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "DAGSTER_HOME": str(work / "dagster_home"),
        "FINETUNE_ASSETS_ROOT": str(work / "root"),
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
    }
    root = work / "root"
    load_before, started = os.getloadavg(), time.time()
    walls = {}
    if not args.report_only and not (root / "mds_shards" / args.key).exists():
        subprocess.run(
            ["finetune-assets", "versions", "add", args.key, "--source", args.source], env=env
        )
        walls["upstream"] = materialize(
            "raw_reviews,tokenized_reviews,mds_shards,baseline_model,pretrained_model",
            args.key,
            env,
        )
    if not args.report_only:
        walls["tuning_study"] = materialize(
            "tuning_study",
            args.key,
            env,
            {"tuning_study": {"config": study_config}} if study_config else None,
        )
    metrics: dict = {}
    if not args.study_only:
        if not args.report_only:
            walls["finetuned_model_with_best"] = materialize(
                "finetuned_model",
                args.key,
                env,
                {"finetuned_model": {"config": {"hyper_parameters_from": "study"}}},
            )
        metrics = latest(root, "finetuned_model", args.key, "metrics.json")
    best = latest(root, "tuning_study", args.key, "best.json")
    trials = latest(root, "tuning_study", args.key, "trials.json")
    recorded = json.loads(Path(DEFAULT_RESULT).read_text())[
        f"{args.source}/{json.dumps({'epochs': 1})}"
    ]
    default = {
        "test_macro_f1": recorded["summary"]["finetuned"]["macro_f1"],
        "test_accuracy": recorded["summary"]["finetuned"]["accuracy"],
        "from": f"{DEFAULT_RESULT} ({recorded['date']}, {recorded['command']})",
    }

    def report(default: dict) -> None:  # written after each stage: a killed run keeps its numbers
        default_f1 = default["test_macro_f1"]
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
            "study_config_overrides": study_config,
            "study_config": TuningConfig(**study_config).model_dump(),  # the budget, as it ran
            "note": args.note,
            "wall_seconds": walls,
            "wall_seconds_total": round(time.time() - started, 1),
            "trials": [{k: t.get(k) for k in TRIAL_FIELDS} for t in trials],
            "trial_states": {
                s: sum(t["state"] == s for t in trials) for s in {t["state"] for t in trials}
            },
            "best_trial": best,
            "tuned": (
                {
                    k: metrics.get(k)
                    for k in ("macro_f1", "accuracy", "global_step", "train_seconds")
                }
                if metrics
                else None
            ),
            "default_recipe": default,
            "tuned_minus_default_macro_f1": round(metrics["macro_f1"] - default_f1, 4)
            if metrics
            else None,
        }
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")

    report(default)
    if not (args.recorded_default or args.study_only or args.report_only):
        walls["finetuned_model_default_recipe"] = materialize("finetuned_model", args.key, env)
        m = latest(root, "finetuned_model", args.key, "metrics.json")
        report(
            {
                "test_macro_f1": m["macro_f1"],
                "test_accuracy": m["accuracy"],
                "global_step": m.get("global_step"),
                "train_seconds": m.get("train_seconds"),
                "from": "finetuned_model with its default config, trained by this run",
            }
        )
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
