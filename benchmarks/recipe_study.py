"""Which default recipe? Today's vs candidate recipes on three real sets, TF-IDF beside them.

    nice -n 5 python benchmarks/recipe_study.py --workdir DIR [--recipes a,b] [--sets x,y]
        [--seeds 42,43] [--parallel 2]

Sets (all offline): ``builtin:rotten_tomatoes`` (the README's default version, its own split: 2,389
/ 305 / 306), a CPU-sized subset of ``builtin:imdb`` and of the shared Arabic reviews
(``../shared/data/arabic_reviews``, three classes, with the default *English* encoder: its
vocabulary sees Arabic as letters, reported as measured). Each set is read, validated and split by
the project's own functions (``read_source`` -> ``validate`` with a ``SplitRule`` -> the tokenize
and shard slice workers, as ``finetune_assets_tests/data_path.py`` runs them), once; the subsets
take rows by a salted hash, and their test fraction is larger (0.3) so that a test score means
something. The split is frozen: every recipe and seed is scored on the same test reviews. TF-IDF is
the ``baseline_model`` recipe (``core/evaluation/baseline.py``) fitted on the same train split.

Each (set, recipe, seed) is one training run, ``python -m finetune_assets.core.training`` in its own
process (the command torchrun runs) with one thread (runs go ``--parallel`` at a time: on a
shared 2-core machine single-thread processes lose less to contention than one two-thread
process), MLflow into a throwaway store, the trainer's own best-validation selection and early
stopping. A recipe is a dict of ``HyperParameters`` overrides over the trainer's defaults *at the
time of the run* (so ``today`` is written out in full: it stays the old defaults when the defaults
change). Results are merged into ``--out`` after every run (an interrupted study keeps what it
finished; a re-run skips what is recorded), with per-(set, recipe) mean and spread over seeds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa

from finetune_assets.core.evaluation.baseline import BaselineModel
from finetune_assets.core.evaluation.evaluate import majority_scores
from finetune_assets.core.io.contracts import read_split_stats
from finetune_assets.core.labels.infer import infer_label_set
from finetune_assets.core.prep.validate import SplitRule, ValidationRules, validate
from finetune_assets.core.sources import SourceSpec, read_source

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "arabic_reviews"
if not SHARED.exists():
    SHARED = Path("/work/shared/data/arabic_reviews")

# name -> (source, rows kept (None: all), validation fraction, test fraction, tokenized max length)
SETS = {
    "rotten_tomatoes": ("builtin:rotten_tomatoes", None, 0.1, 0.1, 512),
    # 1,000 of its 3,000 snippets, test 0.3: three seeds of both recipes fit a loaded 2-core hour
    "rt_1k": ("builtin:rotten_tomatoes", 1000, 0.15, 0.3, 512),
    # 25,000 reviews of ~300 tokens: 1,000 of them, cut at 256 tokens for every recipe (CPU-sized)
    "imdb_1k": ("builtin:imdb", 1000, 0.15, 0.3, 256),
    "arabic_1500": (str(SHARED), 1500, 0.15, 0.3, 512),
}
SUBSET_SALT = "benchmarks/recipe_study/v1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # finetune_assets_tests.data_path

# The trainer's defaults before this study (HyperParameters of commit f2ee4d5), written out.
TODAY = {
    "epochs": 1,
    "lr": 5e-5,
    "warmup_ratio": 0.1,
    "lr_schedule": "linear",
    "batch_size": 8,
    "weight_decay": 0.0,
    "class_weights": "balanced",
    "max_length": 512,
    "select_model": "last",
    "early_stopping_patience": None,
}
RECIPES: dict[str, dict] = {
    "today": TODAY,
    # more passes with the best validation kept (early stopping after 1 flat validation)
    "e3_b8_lr5e-5": {**TODAY, "epochs": 3, "select_model": "best", "early_stopping_patience": 1},
    # the new default (trainer config): 2 epochs, best validation kept
    "e2_b8_lr5e-5": {**TODAY, "epochs": 2, "select_model": "best", "early_stopping_patience": 2},
    # the same number of epochs in half the optimizer steps (faster on CPU), lr scaled up
    "e3_b16_lr1e-4": {
        **TODAY,
        "epochs": 3,
        "batch_size": 16,
        "lr": 1e-4,
        "select_model": "best",
        "early_stopping_patience": 1,
    },
    "e2_b16_lr1e-4": {
        **TODAY,
        "epochs": 2,
        "batch_size": 16,
        "lr": 1e-4,
        "select_model": "best",
        "early_stopping_patience": 1,
    },
    "e3_b16_lr1e-4_unweighted": {
        **TODAY,
        "epochs": 3,
        "batch_size": 16,
        "lr": 1e-4,
        "class_weights": "none",
        "select_model": "best",
        "early_stopping_patience": 1,
    },
    "e3_b16_lr1e-4_cosine": {
        **TODAY,
        "epochs": 3,
        "batch_size": 16,
        "lr": 1e-4,
        "lr_schedule": "cosine",
        "select_model": "best",
        "early_stopping_patience": 1,
    },
    "e3_b16_lr1e-4_warmup0": {
        **TODAY,
        "epochs": 3,
        "batch_size": 16,
        "lr": 1e-4,
        "warmup_ratio": 0.0,
        "select_model": "best",
        "early_stopping_patience": 1,
    },
    "e3_b16_lr1e-4_len128": {
        **TODAY,
        "epochs": 3,
        "batch_size": 16,
        "lr": 1e-4,
        "max_length": 128,
        "select_model": "best",
        "early_stopping_patience": 1,
    },
}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def subset(table: pa.Table, rows: int | None) -> pa.Table:
    """``rows`` reviews chosen by a salted hash of their text: the same ones on every machine."""
    if rows is None or table.num_rows <= rows:
        return table
    texts = table.column("text").to_pylist()
    order = sorted(
        range(len(texts)),
        key=lambda i: hashlib.sha256(f"{SUBSET_SALT}\x00{texts[i]}".encode()).digest(),
    )
    return table.take(sorted(order[:rows]))


def prepare(name: str, root: Path, model_dir: Path) -> dict:
    """Shards and TF-IDF of one set, once (``{root}/{name}/``); returns its description."""
    from finetune_assets_tests.data_path import prepare as tokenize_and_shard

    folder = root / name
    info_file = folder / "set.json"
    if info_file.is_file():
        return json.loads(info_file.read_text())
    source, rows, val, test, max_length = SETS[name]
    raw = subset(read_source(SourceSpec(uri=source)), rows)
    labels = infer_label_set(raw.column("label").to_pylist())
    validated = validate(
        raw, ValidationRules(labels=labels, split=SplitRule(validation=val, test=test))
    )
    accepted = validated.accepted
    for old in ("tokens", "shards"):
        if (folder / old).exists():
            shutil.rmtree(folder / old)
    tokenized, _ = tokenize_and_shard(accepted, model_dir, folder, max_length, labels=labels)
    lengths = tokenized.table(columns=["length"]).column("length").to_pylist()
    shutil.rmtree(folder / "tokens")  # the shards are what the runs read
    texts = accepted.column("text").to_pylist()
    names = accepted.column("label").to_pylist()
    split = accepted.column("split").cast(pa.string()).to_pylist()
    part = {
        s: (
            [t for t, p in zip(texts, split) if p == s],
            [y for y, p in zip(names, split) if p == s],
        )
        for s in ("train", "validation", "test")
    }
    t0 = time.time()
    baseline = BaselineModel.fit(*part["train"], label_set=list(labels.names))
    keep = ("accuracy", "macro_f1", "f1_per_class")
    info = {
        "source": source if name != "arabic_1500" else "shared/data/arabic_reviews",
        "rows_read": raw.num_rows,
        "accepted": accepted.num_rows,
        "rejected": validated.rejected.num_rows,
        "labels": list(labels.names),
        "splits": {s: len(part[s][0]) for s in part},
        "split_rule": {"validation": val, "test": test},
        "tokenized_max_length": max_length,
        "mean_tokens": round(sum(lengths) / len(lengths), 1) if lengths else None,
        "baseline_tfidf": {
            **{k: v for k, v in baseline.evaluate(*part["test"]).items() if k in keep},
            "fit_seconds": round(time.time() - t0, 1),
        },
        "majority": {
            k: v
            for k, v in majority_scores(part["train"][1], part["test"][1], labels.names).items()
            if k in keep
        },
        "train_label_counts": read_split_stats(str(folder / "shards" / "train")).counts(
            len(labels.names)
        ),
    }
    info_file.write_text(json.dumps(info, indent=2))
    return info


# --smoke: a few batches per run, to check the script end to end (its scores measure nothing)
SMOKE = {"limit_train_batches": 4, "limit_val_batches": 2, "limit_test_batches": 2}


def train_run(
    root: Path, model_dir: Path, name: str, recipe: str, seed: int, smoke: bool = False
) -> dict:
    from finetune_assets.core.training.config import TrainerConfig

    info = json.loads((root / name / "set.json").read_text())
    shards = root / name / "shards"
    run = root / "runs" / f"{name}__{recipe}__{seed}"
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    config = TrainerConfig.from_dict(
        {
            **RECIPES[recipe],
            **(SMOKE if smoke else {}),
            "seed": seed,
            "model_dir": str(model_dir),
            "output_dir": str(run / "out"),
            "checkpoint_dir": str(run / "ckpt"),
            "accelerator": "cpu",
            "checkpoint_every_n_steps": 1_000_000,  # the study never resumes
            "log_every_n_steps": 50,
            "progress_every_seconds": 120.0,
            "labels": info["labels"],
            "data": {
                **{f"{s}_url": str(shards / s) for s in ("train", "validation", "test")},
                "train_label_counts": info["train_label_counts"],
            },
            "mlflow": {
                "tracking_uri": f"sqlite:///{run}/mlflow.db",
                "artifact_location": str(run / "mlartifacts"),
                "log_model": False,
                "registered_model_name": None,
            },
        }
    )
    (run / "config.json").write_text(config.to_json())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    before = uptime()
    t0 = time.perf_counter()
    # Its own session: with the kernel's autogroup scheduling (on by default) the processes of
    # one session share one group's CPU, so --parallel runs started from one shell would split
    # a single share on a shared machine instead of running side by side.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "finetune_assets.core.training",
            "--config",
            str(run / "config.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        start_new_session=True,
    )
    wall = time.perf_counter() - t0
    (run / "log.txt").write_text(proc.stdout[-20000:] + "\n" + proc.stderr[-20000:])
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:], "wall_seconds": round(wall, 1)}
    m = json.loads((run / "out" / "metrics.json").read_text())
    sel = m.get("model_selection") or {}
    result = {
        "test_accuracy": round(m["accuracy"], 4),
        "test_macro_f1": round(m["macro_f1"], 4),
        "f1_per_class": {k: round(v, 4) for k, v in m["f1_per_class"].items()},
        "global_step": m["global_step"],
        "epochs_run": m["epochs"],
        "best_epoch": sel.get("best_epoch"),
        "early_stopped": sel.get("early_stopped"),
        "validation_curve": [round(p["value"], 4) for p in sel.get("curve", [])],
        "train_seconds": round(m["train_seconds"], 1),
        "samples_per_sec": round(m["samples_per_sec"], 2),
        "wall_seconds": round(wall, 1),
        "uptime_before": before,
        "uptime_after": uptime(),
    }
    shutil.rmtree(run / "ckpt", ignore_errors=True)  # 2 x 270 MB per run
    shutil.rmtree(run / "out" / "model", ignore_errors=True)
    return result


def summarize(result: dict) -> None:
    """Mean and spread (population s.d. and min-max) over seeds per (set, recipe), and each
    recipe's mean over sets, beside today's.
    """
    table: dict = {}
    for name, per_recipe in result["runs"].items():
        for recipe, per_seed in per_recipe.items():
            scores = [r["test_macro_f1"] for r in per_seed.values() if "test_macro_f1" in r]
            if not scores:
                continue
            table.setdefault(name, {})[recipe] = {
                "seeds": len(scores),
                "mean_macro_f1": round(statistics.mean(scores), 4),
                "sd": round(statistics.pstdev(scores), 4) if len(scores) > 1 else None,
                "min": min(scores),
                "max": max(scores),
                "mean_train_seconds": round(
                    statistics.mean(
                        r["train_seconds"] for r in per_seed.values() if "train_seconds" in r
                    ),
                    1,
                ),
                "minus_tfidf": round(
                    statistics.mean(scores) - result["sets"][name]["baseline_tfidf"]["macro_f1"], 4
                ),
            }
    result["table"] = table
    recipes = {r for per in table.values() for r in per}
    result["mean_over_sets"] = {
        r: round(statistics.mean(table[s][r]["mean_macro_f1"] for s in table), 4)
        for r in sorted(recipes)
        if all(r in table[s] for s in table)
    }


def markdown(result: dict) -> str:
    """The table for benchmarks/README.md: test macro-F1 mean (spread) per set and recipe."""
    table = result.get("table", {})
    sets = sorted(table, key=lambda s: list(SETS).index(s) if s in SETS else len(SETS))
    recipes = sorted({r for s in sets for r in table[s]}, key=lambda r: (r != "today", r))
    head = ["recipe", *[f"{s} (test {result['sets'][s]['splits']['test']})" for s in sets]]
    rows = [
        "| TF-IDF baseline | "
        + " | ".join(f"{result['sets'][s]['baseline_tfidf']['macro_f1']:.3f}" for s in sets)
        + " |"
    ]
    for r in recipes:
        cells = []
        for s in sets:
            c = table[s].get(r)
            if c is None:
                cells.append("-")
            elif c["seeds"] > 1:
                cells.append(
                    f"{c['mean_macro_f1']:.3f} ± {c['sd']:.3f} ({c['seeds']} seeds, "
                    f"{c['min']:.3f}-{c['max']:.3f})"
                )
            else:
                cells.append(f"{c['mean_macro_f1']:.3f} (1 seed)")
        rows.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(["| " + " | ".join(head) + " |", "|" + " --- |" * len(head), *rows])


def merge(other: Path, out: Path) -> None:
    """Runs of two invocations (each writes its own --out while running) in one file."""
    into, more = json.loads(out.read_text()), json.loads(other.read_text())
    for name, per_recipe in more["runs"].items():
        for recipe, per_seed in per_recipe.items():
            into["runs"].setdefault(name, {}).setdefault(recipe, {}).update(per_seed)
    into["sets"] = {**more.get("sets", {}), **into["sets"]}
    into["recipes"] = {**more.get("recipes", {}), **into["recipes"]}
    into.setdefault("merged_commands", []).append(more.get("command"))
    into.setdefault("invocations", []).extend(more.get("invocations", []))
    write(out, into)


def write(out: Path, result: dict) -> None:
    summarize(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="shards and runs (reused when re-run); required to run")
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--recipes", default="today,e3_b16_lr1e-4")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time, 1 thread each")
    parser.add_argument("--out", default="benchmarks/results/recipe_study.json")
    parser.add_argument(
        "--smoke", action="store_true", help="4 batches per run, a throwaway --out (a check)"
    )
    parser.add_argument("--table", action="store_true", help="print --out as a markdown table")
    parser.add_argument(
        "--merge", default=None, help="merge this results file (another --out) into --out"
    )
    args = parser.parse_args()
    if args.merge:
        merge(Path(args.merge), Path(args.out))
        return
    if args.table:
        print(markdown(json.loads(Path(args.out).read_text())))
        return
    from finetune_assets.core.prep.pretrained import DEFAULT_MODEL, save_pretrained_model

    if args.smoke and args.out == parser.get_default("out"):
        args.out = str(Path(args.workdir or ".") / "smoke.json")

    if not args.workdir:
        parser.error("--workdir is required to run the study")
    root = Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    model_dir = root / "model"
    if not (model_dir / "config.json").is_file():
        save_pretrained_model(DEFAULT_MODEL, None, model_dir)
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    result.setdefault("runs", {})
    result["command"] = " ".join([f"nice -n {os.nice(0)} python", *sys.argv])
    # every invocation that wrote into this file (a study may be run in parts: a re-run skips
    # what is recorded), with its start time and load
    result.setdefault("invocations", []).append(
        {
            "command": result["command"],
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "uptime": uptime(),
        }
    )
    result["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(), "device": "cpu"}
    result["recipes"] = {**result.get("recipes", {}), **RECIPES}
    sets = args.sets.split(",")
    result.setdefault("sets", {})
    for name in sets:
        result["sets"][name] = prepare(name, root, model_dir)
        print(name, json.dumps(result["sets"][name]["splits"]), flush=True)
    write(out, result)
    # seed-major: every set and recipe once before any second seed
    todo = [
        (name, recipe, int(seed))
        for seed in args.seeds.split(",")
        for recipe in args.recipes.split(",")
        for name in sets
        if str(seed) not in result["runs"].get(name, {}).get(recipe, {})
    ]
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        futures = {pool.submit(train_run, root, model_dir, *job, args.smoke): job for job in todo}
        for future in concurrent.futures.as_completed(futures):
            name, recipe, seed = futures[future]
            run = future.result()
            result["runs"].setdefault(name, {}).setdefault(recipe, {})[str(seed)] = run
            result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            write(out, result)
            print(name, recipe, seed, json.dumps(run)[:400], flush=True)


if __name__ == "__main__":
    main()
