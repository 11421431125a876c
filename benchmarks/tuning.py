"""Tuning, measured at equal compute: the study's winner against the default recipe trained for
the winner's epochs, ``--seeds`` seeds per arm, a paired bootstrap interval on the test split.

    nice python benchmarks/tuning.py --workdir /tmp/tuning-bench       # hours on 2 CPU cores
    python benchmarks/tuning.py --workdir /tmp/rehearsal --rehearsal   # minutes: CI's rehearsal
    nice python benchmarks/tuning.py --workdir DIR --rows 1000 --split 0.15,0.3 --key rt_1k
        # the recipe study's rt_1k (the same 1,000 snippets and split fractions): ~1 h on 2 cores

Runs the README's commands in ``--workdir`` (``DAGSTER_HOME`` + storage root; kept, so a killed
run continues the same study): ``finetune-assets versions add``, the upstream assets,
``tuning_study`` (``--study-config`` overrides its defaults), then for each seed
``finetuned_model`` with ``hyper_parameters_from: study`` (the winner, the study's ``fixed``
settings applied) and ``finetuned_model`` with its defaults, the study's ``fixed`` settings and
the winner's epochs (the default recipe at the same compute: the same samples seen). Each model
predicts the version's frozen test split (``finetune_assets.core.evaluation.inference``); the
interval is a paired
bootstrap over test reviews of the difference of the arms' mean macro-F1 (each resample scores
every model on the same reviews), 2.5 and 97.5 percentiles.

``--rows N``: the version is ``N`` reviews of ``--source`` chosen as ``recipe_study.py`` chooses
them (a salted hash of the text), written to a CSV in ``--workdir`` and registered from there;
``--split VAL,TEST`` sets ``raw_reviews``' validation and test fractions.

``--rehearsal``: the same path on a tiny BERT built from a config, 2-step trials and 4-batch models,
for CI and for checking the script; its numbers measure nothing.
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

import numpy as np

from finetune_assets.core.sources.builtin_sets import DEFAULT_SOURCE

TRIAL_FIELDS = ("number", "state", "value", "reports", "pruned_at_step", "seconds", "params")
GATE_OFF = {"must_beat_majority_baseline": False, "baseline_margin": None}
REHEARSAL_STUDY = {
    "n_trials": 2,
    "trial_max_steps": 2,
    "reports_per_trial": 1,
    "epochs": [1],
    "batch_size": [8],
    "pruner": "none",
    "sampler_startup_trials": 1,
    "fixed": {"max_length": 48, "num_workers": 0, "limit_val_batches": 2, "accelerator": "cpu"},
}
REHEARSAL_FINETUNE = {"limit_train_batches": 4, "limit_test_batches": 2}


def run(cmd: list[str], env: dict[str, str]) -> float:
    print("$", " ".join(cmd), flush=True)
    t = time.time()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True)
    if proc.returncode:
        sys.exit(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return round(time.time() - t, 1)


def materialize(select: str, key: str, env: dict[str, str], ops: dict | None = None) -> float:
    cmd = ["dagster", "asset", "materialize", "-m", "finetune_assets.definitions"]
    cmd += ["--select", select, "--partition", key]
    if ops:
        cmd += ["--config-json", json.dumps({"ops": ops})]
    return run(cmd, env)


def macro_f1(y: np.ndarray, p: np.ndarray, k: int) -> float:
    """Macro-F1 over ``k`` classes (a class absent from both truth and predictions: F1 0)."""
    f1 = []
    for c in range(k):
        tp = np.sum((p == c) & (y == c))
        denom = np.sum(p == c) + np.sum(y == c)
        f1.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(f1))


def paired_bootstrap(
    y: np.ndarray, winner: list[np.ndarray], default: list[np.ndarray], k: int, n: int, seed: int
) -> dict:
    """The winner's mean macro-F1 over seeds minus the default's, on the test split and on ``n``
    resamples of its reviews (the same resample for every model: paired).
    """

    def diff(idx: np.ndarray) -> float:
        w = np.mean([macro_f1(y[idx], p[idx], k) for p in winner])
        d = np.mean([macro_f1(y[idx], p[idx], k) for p in default])
        return float(w - d)

    rng = np.random.default_rng(seed)
    draws = [diff(rng.integers(0, len(y), len(y))) for _ in range(n)]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return {
        "difference": round(diff(np.arange(len(y))), 4),
        "interval_95": [round(float(lo), 4), round(float(hi), 4)],
        "resamples": n,
        "p_winner_not_better": round(float(np.mean(np.array(draws) <= 0)), 4),
    }


def write_subset(source: str, rows: int, path: Path) -> Path:
    """``rows`` reviews of ``source`` as the recipe study picks them, as a CSV (once)."""
    if path.exists():
        return path
    import pyarrow.csv as pacsv

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from recipe_study import subset

    from finetune_assets.core.sources import SourceSpec, read_source

    table = subset(read_source(SourceSpec(uri=source)), rows).select(["text", "label"])
    tmp = path.with_suffix(".partial")
    pacsv.write_csv(table, tmp)
    tmp.replace(path)
    return path


def current(root: Path, asset: str, key: str) -> Path:
    from finetune_assets.core.io.storage import Storage

    return Path(Storage(str(root)).require(asset, key).url)


def predict_test(root: Path, key: str) -> tuple[list[str], list[str], dict]:
    """The current finetuned_model's predictions on the version's test split, with its labels."""
    from finetune_assets.core.evaluation.inference import Classifier
    from finetune_assets.core.io.contracts import MODEL_SUBDIR
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.defs.models.baseline_model import split_reviews

    texts, labels = split_reviews(Storage(str(root)), key)["test"]
    folder = current(root, "finetuned_model", key)
    trainer = json.loads((folder / "trainer_config.json").read_text())
    model = Classifier.from_folder(folder / MODEL_SUBDIR)
    predicted = model.predict_labels(texts, max_length=trainer["max_length"])
    metrics = json.loads((folder / "metrics.json").read_text())
    return labels, predicted, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=DEFAULT_SOURCE)
    parser.add_argument("--key", default="rotten_tomatoes")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--study-config", default="{}", help="tuning_study overrides as JSON")
    parser.add_argument(
        "--finetune-config", default="{}", help="finetuned_model overrides for both arms (JSON)"
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=None, help="a subset of the source's reviews")
    parser.add_argument("--split", default=None, help="VAL,TEST fractions for raw_reviews")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--rehearsal", action="store_true", help="tiny model and budgets (CI)")
    parser.add_argument("--note", default="")
    parser.add_argument("--out", default="benchmarks/results/tuning.json")
    args = parser.parse_args()
    study_config = json.loads(args.study_config)
    extra = json.loads(args.finetune_config)
    work = Path(args.workdir)
    (work / "dagster_home").mkdir(parents=True, exist_ok=True)
    root = work / "root"
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "DAGSTER_HOME": str(work / "dagster_home"),
        "FINETUNE_ASSETS_ROOT": str(root),
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }
    upstream_ops: dict = {}
    if args.rehearsal:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from finetune_assets_tests.tiny_models import build_tiny_bert

        tiny = work / "tiny-bert"
        if not tiny.exists():
            build_tiny_bert(tiny)
        upstream_ops = {"pretrained_model": {"config": {"source": str(tiny)}}}
        study_config = {**REHEARSAL_STUDY, **study_config}
        extra = {**REHEARSAL_FINETUNE, **extra}
        if args.out == parser.get_default("out"):
            args.out = "benchmarks/results/tuning_rehearsal.json"
    source = args.source
    if args.rows is not None:
        source = str(write_subset(args.source, args.rows, work / f"subset-{args.rows}.csv"))
    if args.split:
        val, test = (float(x) for x in args.split.split(","))
        upstream_ops["raw_reviews"] = {
            "config": {"validation_fraction": val, "test_fraction": test}
        }
    load_before, started = os.getloadavg(), time.time()
    walls: dict[str, float] = {}
    if not (root / "mds_shards" / args.key).exists():
        run(["finetune-assets", "versions", "add", args.key, "--source", source], env)
        walls["upstream"] = materialize(
            "raw_reviews,tokenized_reviews,mds_shards,baseline_model,pretrained_model",
            args.key,
            env,
            upstream_ops,
        )
    walls["tuning_study"] = materialize(
        "tuning_study", args.key, env, {"tuning_study": {"config": study_config}}
    )
    study = current(root, "tuning_study", args.key)
    best = json.loads((study / "best.json").read_text())
    trials = json.loads((study / "trials.json").read_text())
    epochs = best["params"]["epochs"]
    arms: dict[str, list[dict]] = {"winner": [], "default": []}
    predictions: dict[str, list[np.ndarray]] = {"winner": [], "default": []}
    names: list[str] = []
    y = np.array([])
    for seed in range(args.seeds):
        for arm in ("winner", "default"):
            config = (
                {**extra, "seed": seed, "hyper_parameters_from": "study"}
                if arm == "winner"
                else {**best["fixed"], **extra, "seed": seed, "epochs": epochs}
            )
            ops = {
                "finetuned_model": {"config": config},
                "finetuned_model_quality_gate": {"config": GATE_OFF},
            }
            walls[f"{arm}_seed{seed}"] = materialize("finetuned_model", args.key, env, ops)
            labels, predicted, metrics = predict_test(root, args.key)
            names = names or sorted(set(labels))
            index = {n: i for i, n in enumerate(names)}
            y = np.array([index[v] for v in labels])
            predictions[arm].append(np.array([index.get(v, -1) for v in predicted]))
            arms[arm].append(
                {
                    "seed": seed,
                    "config": config,
                    "test_macro_f1": round(macro_f1(y, predictions[arm][-1], len(names)), 4),
                    "metrics_json_macro_f1": metrics.get("macro_f1"),
                    "global_step": metrics.get("global_step"),
                    "train_seconds": metrics.get("train_seconds"),
                }
            )
    comparison = paired_bootstrap(
        y, predictions["winner"], predictions["default"], len(names), args.resamples, seed=0
    )
    result = {
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(started)),
        "rehearsal": args.rehearsal,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "device": "cpu",
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "source": args.source,
        "rows": args.rows,
        "split": args.split,
        "test_reviews": int(len(y)),
        "study_config_overrides": study_config,
        "finetune_overrides": extra,
        "note": args.note,
        "wall_seconds": walls,
        "wall_seconds_total": round(time.time() - started, 1),
        "trials": [{k: t.get(k) for k in TRIAL_FIELDS} for t in trials],
        "best_trial": best,
        "equal_compute": f"the default recipe trained for the winner's {epochs} epochs",
        "arms": arms,
        "winner_minus_default_macro_f1": comparison,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(comparison))


if __name__ == "__main__":
    main()
