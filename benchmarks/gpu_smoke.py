"""GPU smoke test of the trainer: what only a GPU can show, in one prepared run (a few minutes on one GPU).

For MiniLM (the packaged all-MiniLM-L6-v2) and a base-size BERT built from its config (12 layers, 768
wide, random weights: no hub needed), with strategy ``ddp`` (one device) and ``fsdp``, each through the
trainer's own ``train()``:

- bf16-mixed precision, gradient clipping at 1.0, AdamW with weight decay 0.01 (the log must show a
  non-empty decay group: FSDP with ``use_orig_params`` flattens parameters);
- fit then test (FSDP must not re-wrap its flattened model for the test);
- checkpoints under an object-store-style URL (``memory://``: an fsspec URL, what ``s3://`` goes
  through), then the same config again, which must resume from that URL at the final step; and a
  run SIGKILLed right after its half-way checkpoint, resumed by ``train()``, which trains to the end;
- throughput from the trainer's ``metrics.json``: samples/s, tokens/s and MFU over its steady-state
  window (training steps only, CUDA events; training/throughput.py).

Run on the GPU machine from the repository root (after ``pip install -e .``)::

    python benchmarks/gpu_smoke.py            # results: benchmarks/results/gpu_smoke.json (and $OUT/)
    python benchmarks/gpu_smoke.py --cpu-check  # the script's plumbing on CPU: tiny model, ddp + fsdp, fp32

Exit status 0 only when every case passed; each case's checks and numbers are in the JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import fsspec
import numpy as np
import torch

from finetune_assets.contracts import read_split_stats
from finetune_assets.data.models import packaged_model_dir
from finetune_assets.data.shards import write_split
from finetune_assets.training.config import TrainerConfig
from finetune_assets.training.run import train
from finetune_assets_tests.tiny_models import build_tiny_bert

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_smoke.json"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def write_data(root: Path, sizes: dict[str, int], seed: int = 0) -> Path:
    """Synthetic MDS splits with the ``mds_shards`` schema: review-like lengths (16-256 tokens), 3 labels."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    for split, n in sizes.items():
        lengths = rng.integers(16, 257, size=n)
        ids = [
            np.concatenate([[101], rng.integers(1000, 30000, size=k - 2), [102]]).astype(np.uint16)
            for k in lengths
        ]
        table = pa.table(
            {
                "input_ids": pa.array(ids, type=pa.list_(pa.uint16())),
                "label": pa.array(rng.integers(0, 3, size=n), type=pa.int8()),
            }
        )
        write_split(table, root / split, size_limit="1mb")
    return root


def base_size_bert(out: Path) -> Path:
    """bert-base's shape (110M parameters) with MiniLM's tokenizer, random weights, saved as an HF folder."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(packaged_model_dir())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
    )
    BertForSequenceClassification(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def killed_and_resumed(cfg: dict, work: Path) -> dict:
    """One process trains until its first checkpoint exists and is SIGKILLed; ``train()`` then resumes it."""
    import signal
    import subprocess

    work.mkdir(parents=True, exist_ok=True)
    (work / "killed.json").write_text(json.dumps(cfg))
    last = Path(cfg["checkpoint_dir"]) / "last.ckpt"
    # Not this process's process-group variables (an in-process FSDP run set them, its store holds the port)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "finetune_assets.training", "--config", str(work / "killed.json")],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "killed.log", "w"),
        env=env,
    )
    while not last.exists() and proc.poll() is None:
        time.sleep(0.02)
    killed = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if not killed:
        return {
            "killed": False,
            "exit": proc.returncode,
            "log": (work / "killed.log").read_text()[-2000:],
        }
    return {**train(TrainerConfig.from_dict(cfg)), "killed": True}


def run_case(
    name: str,
    model_dir: str,
    data: Path,
    work: Path,
    strategy: str,
    cpu: bool,
    steps: int,
    batch: int,
) -> dict:
    url = f"memory://gpu-smoke/{name}/ckpt"
    cfg = {
        "model_dir": model_dir,
        "output_dir": str(work / name / "out"),
        "checkpoint_dir": url,
        "accelerator": "cpu" if cpu else "gpu",
        "precision": "32" if cpu else "bf16-mixed",
        "strategy": strategy,
        "gradient_clip_val": 1.0,
        "epochs": 1,
        "max_steps": steps,
        "checkpoint_every_n_steps": max(1, steps // 2),
        "log_every_n_steps": 10,
        "class_weights": "balanced",
        "optimizer": "adamw",
        "lr": 5e-5,
        "weight_decay": 0.01,
        "warmup_ratio": 0.1,
        "batch_size": batch,
        "num_workers": 2,
        "max_length": 256,
        "data": {
            "train_url": str(data / "train"),
            "train_label_counts": read_split_stats(str(data / "train")).counts(3),
            "validation_url": str(data / "validation"),
            "test_url": str(data / "test"),
        },
        "mlflow": {
            "tracking_uri": f"sqlite:///{work}/mlflow.db",
            "artifact_location": str(work / "mlartifacts"),
            "log_model": False,
        },
    }
    lines = _Lines()
    logging.getLogger("finetune_assets").addHandler(lines)
    checks: dict[str, bool] = {}
    result: dict = {"case": name, "strategy": strategy}
    try:
        t0 = time.time()
        first = train(TrainerConfig.from_dict(cfg))
        result["first_run_seconds"] = time.time() - t0
        decay = [line for line in lines.lines if line.startswith("AdamW:")]
        result["decay_groups"] = decay
        checks["fit_then_test"] = (
            first["confusion_matrix"] is not None and first["global_step"] == steps
        )
        checks["each_test_sample_once"] = (
            sum(map(sum, first["confusion_matrix"])) == first["test_samples"]
        )
        checks["decay_group_non_empty"] = bool(decay) and not decay[0].startswith("AdamW: 0 ")
        checks["checkpoint_at_object_store_url"] = fsspec.filesystem("memory").exists(
            f"/gpu-smoke/{name}/ckpt/last.ckpt"
        )
        again = train(
            TrainerConfig.from_dict(cfg)
        )  # resumes from the memory:// checkpoint, at its end
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
        )
        result["killed_and_resumed"] = {
            k: killed.get(k) for k in ("resumed_at_step", "global_step", "killed", "exit", "log")
        }
        checks["killed_mid_run_resumes_and_trains_more"] = bool(killed.get("killed")) and 0 < (
            killed.get("resumed_at_step") or 0
        ) < steps == killed.get("global_step")
        checks["exported_and_predicts"] = (
            work / name / "out" / "model" / "model.safetensors"
        ).exists()
        for key in (
            "samples_per_sec",
            "tokens_per_sec",
            "train_seconds",
            "samples_seen",
            "tokens_seen",
            "timings",
            "throughput",
        ):
            result[key] = first[key]
        if not cpu:
            result.update(
                device=torch.cuda.get_device_name(),
                mfu=first["throughput"]["mfu"],
                max_memory_gib=torch.cuda.max_memory_allocated() / 2**30,
            )
            torch.cuda.reset_peak_memory_stats()
    except Exception as err:  # noqa: BLE001 - one case's failure is recorded, the others still run
        result["error"] = f"{type(err).__name__}: {err}"
        result["traceback"] = traceback.format_exc()[-4000:]
    finally:
        logging.getLogger("finetune_assets").removeHandler(lines)
    result["checks"] = checks
    result["passed"] = bool(checks) and all(checks.values()) and "error" not in result
    print(
        json.dumps({k: v for k, v in result.items() if k != "traceback"}, default=str), flush=True
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cpu-check", action="store_true", help="tiny model, ddp and fsdp, fp32 on CPU"
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.cpu_check and not torch.cuda.is_available():
        print("no GPU: run with --cpu-check to test the script itself", file=sys.stderr)
        return 2
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        work = Path(tmp)
        steps, batch = (4, 8) if args.cpu_check else (args.steps, args.batch_size)
        n = steps * batch + batch // 2 + 1  # uneven on purpose
        data = write_data(
            work / "data", {"train": n, "validation": 3 * batch + 1, "test": 4 * batch + 3}
        )
        if args.cpu_check:
            models = {"tiny": str(build_tiny_bert(work / "tiny"))}
            strategies = ["ddp", "fsdp"]
        else:
            models = {
                "minilm": str(packaged_model_dir()),
                "bert_base": str(base_size_bert(work / "bert-base")),
            }
            strategies = ["ddp", "fsdp"]
        cases = [
            run_case(f"{m}-{s}", d, data, work, s, args.cpu_check, steps, batch)
            for m, d in models.items()
            for s in strategies
        ]
    report = {
        "command": "python benchmarks/gpu_smoke.py" + (" --cpu-check" if args.cpu_check else ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "steps": steps,
        "batch_size": batch,
        "wall_seconds": time.time() - started,
        "passed": all(c["passed"] for c in cases),
        "cases": cases,
    }
    if not args.cpu_check:
        RESULTS.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_smoke.json").write_text(
            json.dumps(report, indent=2, default=str) + "\n"
        )
    print(
        f"gpu smoke: {'PASSED' if report['passed'] else 'FAILED'} in {report['wall_seconds']:.0f}s"
    )
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
