"""Training throughput: run totals, and a steady-state window that counts training steps only.

Run totals (samples, tokens, training seconds) feed the progress line and ETA and travel in the
checkpoint. They include everything between epoch start and end (the first steps' start-up,
checkpoint saves), so they understate speed. The *steady-state window* measures what the
hardware does per step: the time from one training batch's start to the next, skipping the first
``warmup_steps`` of each epoch and every interval in which a checkpoint was saved or validation
ran (and the step whose interval it is, so samples and seconds stay paired). On a GPU the interval
is timed with CUDA events (no host sync per step: events are read at the log interval, where
the counts are all-reduced anyway); on CPU with ``perf_counter``.

Reported as Lightning's ``ThroughputMonitor`` does: for all ranks (``throughput/samples_per_sec``,
``throughput/flops_per_sec``: the whole job) and per device (``device/samples_per_sec``,
``device/flops_per_sec``: the all-rank rate / world size), and ``device/mfu`` = per-device FLOP/s /
one device's dense bf16 peak (:data:`PEAK_BF16`). Dividing the whole job's FLOP/s by one device's
peak would read ``world_size`` times too high. Tokens both ways: real (non-pad) tokens/s and the
padded tokens/s the model actually ran (the FLOPs are counted over the padded batch).

The FLOPs are the model's own, counted from its ``nn.Linear`` layers and shape over the padded batch
it ran (:func:`train_flops`; a test checks the formula against ``torch.utils.flop_counter``).
"""

from __future__ import annotations

import time
from typing import Any

import pytorch_lightning as pl
import torch

from finetune_assets.core.training.data.sharding import encoder_layer_class

CHECKPOINT_KEY = (
    "review_classifier"  # the totals' place in a checkpoint (the module keeps world_size there)
)
# Peak dense (no 2:4 sparsity) bf16 tensor-core FLOP/s per device variant, from NVIDIA's data
# sheets as torchtitan's ``get_peak_flops`` has them; MFU is left out for other devices. The variant
# matters: an H100 PCIe or NVL peaks well below an SXM board.
PEAK_BF16 = {
    "B200": 2250e12,
    "H200 NVL": 835e12,
    "H200": 989e12,  # SXM
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM ("NVIDIA H100 80GB HBM3")
    "A100": 312e12,  # SXM and PCIe alike
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "A10": 125e12,
}


def train_flops(model: torch.nn.Module) -> tuple[int, int, int]:
    """(per token, per token x sequence length, per sequence): a training step on a ``[B, T]``
    batch costs ``B * (a*T + b*T*T + c)`` FLOPs. Each ``nn.Linear`` weight in the encoder blocks
    costs 2 FLOPs per token forward and 4 backward; attention's scores and weighted sum 4 x width
    per token pair and layer forward, 8 backward; the head's layers (pooler, classifier) see one
    token per sequence.
    """
    block = encoder_layer_class(model)
    per_token = sum(
        m.weight.numel()
        for b in model.modules()
        if isinstance(b, block)
        for m in b.modules()
        if isinstance(m, torch.nn.Linear)
    )
    every = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    config = getattr(model, "config", None)
    layers, width = getattr(config, "num_hidden_layers", 0), getattr(config, "hidden_size", 0)
    return 6 * per_token, 12 * layers * width, 6 * (every - per_token)


def device_variant(name: str) -> str | None:
    """The :data:`PEAK_BF16` key of a CUDA device name (``torch.cuda.get_device_name``), or None.

    Most specific first: ``"NVIDIA H100 PCIe"`` is an ``H100 PCIe``, ``"NVIDIA H100 80GB HBM3"``
    an ``H100`` (SXM), ``"NVIDIA L40S"`` not an ``L4``; HBM2e H100 boards are PCIe.
    """
    words = set(name.upper().replace("-", " ").split())  # whole words: "L4" is not "L40S"
    if "H100" in words and words & {"PCIE", "HBM2E"}:
        return "H100 PCIe"
    for key in sorted(PEAK_BF16, key=len, reverse=True):  # "H100 NVL" before "H100"
        if set(key.upper().split()) <= words:
            return key
    return None


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    variant = device_variant(torch.cuda.get_device_name(device))
    return PEAK_BF16[variant] if variant else None


class Throughput(pl.Callback):
    """Samples, tokens (all ranks) and training seconds as run totals, and the steady-state window.

    Counted per batch from the loader's Python ints (no device sync) and all-reduced only at the log
    interval, epoch ends and checkpoints, which every rank reaches together.
    """

    def __init__(self, warmup_steps: int = 2) -> None:
        self.warmup_steps = warmup_steps
        self.samples_seen = 0
        self.tokens_seen = 0
        self.train_seconds = 0.0
        self.start_step = 0
        self._pending = [0, 0]  # this rank's samples and tokens since the last all-reduce
        self._t_epoch: float | None = None
        self._t_val: float | None = None
        self._val_seconds = 0.0
        # steady-state window: this rank's intervals awaiting the next all-reduce, and totals
        self._mark: Any = None  # clock at the current batch's start
        self._mark_step = 0  # optimizer steps done before it
        self._current: tuple[int, int, int, int, int] | None = (
            None  # (samples, tokens, B*T, B*T*T, B)
        )
        self._clean = False  # nothing but training since the mark
        self._batches = 0  # batches started this epoch
        self._intervals: list[tuple[Any, Any, tuple[int, ...]]] = []
        self.window = {
            "steps": 0,
            "samples": 0,
            "tokens": 0,
            "seconds": 0.0,
            "bt": 0,
            "btt": 0,
            "b": 0,
        }
        self._first_step: int | None = None
        self._flops: tuple[int, int, int] = (0, 0, 0)
        self._peak: float | None = None
        self._device_name: str | None = None
        self._world = 1
        self._cuda = False

    # -- clocks ---------------------------------------------------------------------------------

    def _now(self) -> Any:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _seconds(self, start: Any, end: Any) -> float:
        if self._cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return end - start

    # -- run totals -----------------------------------------------------------------------------

    def _sync(self, trainer: pl.Trainer) -> None:
        w = [0] * 6  # steps, samples, tokens, B*T, B*T*T, B of this rank's finished intervals
        seconds = 0.0
        for start, end, counts in self._intervals:
            seconds += self._seconds(start, end)
            w[0] += 1
            for i, c in enumerate(counts):
                w[i + 1] += c
        self._intervals = []
        counts = torch.tensor(
            self._pending + w, dtype=torch.int64, device=trainer.strategy.root_device
        )
        counts = trainer.strategy.reduce(counts, reduce_op="sum")
        slowest = trainer.strategy.reduce(
            torch.tensor(seconds, dtype=torch.float64, device=trainer.strategy.root_device),
            reduce_op="max",
        )
        self._pending = [0, 0]
        self.samples_seen += int(counts[0])
        self.tokens_seen += int(counts[1])
        steps, world = int(counts[2]), max(1, trainer.world_size)
        self.window["steps"] += steps // world  # every rank timed the same steps
        for key, i in (("samples", 3), ("tokens", 4), ("bt", 5), ("btt", 6), ("b", 7)):
            self.window[key] += int(counts[i])
        self.window["seconds"] += float(slowest)  # ranks run in lockstep: the slowest sets the pace

    def elapsed(self) -> float:
        """Training seconds so far (this epoch's included, validation excluded)."""
        running = (
            time.perf_counter() - self._t_epoch - self._val_seconds
            if self._t_epoch is not None
            else 0.0
        )
        return self.train_seconds + running

    def estimated_samples(self, world: int) -> int:
        """The run total, this rank's unsynced samples counted ``world`` times (no collective)."""
        return self.samples_seen + self._pending[0] * world

    def steady_state(self) -> dict[str, Any]:
        """The window's numbers and what it covers (``metrics.json``'s ``throughput``).

        ``*_per_sec`` are for all ranks, ``device_*`` per device (all ranks / world size);
        ``mfu`` is per device: ``device_flops_per_sec`` / one device's peak.
        """
        w = self.window
        seconds = w["seconds"]
        world = self._world
        out: dict[str, Any] = {
            "window_batches": w["steps"],
            "window_seconds": seconds,
            "window_first_step": self._first_step,  # steps done before the window's first batch
            "excludes": f"the first {self.warmup_steps} steps of each epoch, steps with a "
            "checkpoint save or validation, the last step of each epoch",
            "clock": "cuda events" if self._cuda else "perf_counter",
            "world_size": world,
            "samples_per_sec": None,
            "tokens_per_sec": None,  # real (non-pad) tokens
            "padded_tokens_per_sec": None,  # what the model ran (batch x its longest sequence)
            "padding_fraction": 1 - w["tokens"] / w["bt"] if w["bt"] else None,
            "flops_per_sec": None,
            "device_samples_per_sec": None,
            "device_tokens_per_sec": None,
            "device_padded_tokens_per_sec": None,
            "device_flops_per_sec": None,
            "mfu": None,
            "device": self._device_name,
            "peak_flops_per_sec": self._peak,  # one device's dense bf16 peak
            "flops_per_token": self._flops[0],
            "flops_per_token_per_length": self._flops[1],
            "flops_per_sequence": self._flops[2],
        }
        if seconds > 0:
            flops = self._flops[0] * w["bt"] + self._flops[1] * w["btt"] + self._flops[2] * w["b"]
            rates = {
                "samples_per_sec": w["samples"] / seconds,
                "tokens_per_sec": w["tokens"] / seconds,
                "padded_tokens_per_sec": w["bt"] / seconds,
                "flops_per_sec": flops / seconds,
            }
            out.update(rates)
            out.update({f"device_{k}": v / world for k, v in rates.items()})
            if self._peak:
                out["mfu"] = out["device_flops_per_sec"] / self._peak
        return out

    def metrics(self) -> dict[str, float]:
        """The window as MLflow metrics, named as Lightning's ``ThroughputMonitor`` names them."""
        steady = self.steady_state()
        if not steady["samples_per_sec"]:
            return {}
        out = {}
        for key in ("samples_per_sec", "tokens_per_sec", "padded_tokens_per_sec", "flops_per_sec"):
            out[f"throughput/{key}"] = steady[key]
            out[f"device/{key}"] = steady[f"device_{key}"]
        if steady["mfu"] is not None:
            out["device/mfu"] = steady["mfu"]
        return out

    def summary(self) -> dict[str, Any]:
        """samples/s and tokens/s over the steady-state window (else over the training time)."""
        steady = self.steady_state()
        seconds = max(self.train_seconds, 1e-9)
        return {
            "samples_seen": self.samples_seen,
            "tokens_seen": self.tokens_seen,
            "train_seconds": self.train_seconds,
            "samples_per_sec": steady["samples_per_sec"] or self.samples_seen / seconds,
            "tokens_per_sec": steady["tokens_per_sec"] or self.tokens_seen / seconds,
            "throughput": steady,
        }

    # -- hooks ----------------------------------------------------------------------------------

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        device = trainer.strategy.root_device
        self._cuda = device.type == "cuda"
        self._peak = peak_flops(device)
        self._device_name = torch.cuda.get_device_name(device) if self._cuda else device.type
        self._world = max(1, int(trainer.world_size))
        model = getattr(pl_module, "model", pl_module)
        self._flops = train_flops(model)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start_step = int(trainer.global_step)  # > 0 when resumed from a checkpoint

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t_epoch, self._val_seconds = time.perf_counter(), 0.0
        self._mark, self._current, self._batches = None, None, 0

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = self._now()
        if (
            self._mark is not None
            and self._clean
            and self._current is not None
            and self._batches > self.warmup_steps
        ):
            self._intervals.append((self._mark, now, self._current))
            if self._first_step is None:
                self._first_step = self._mark_step
        b, t = batch["input_ids"].shape
        self._current = (
            int(batch.get("num_samples", b)),
            int(batch["num_tokens"]),
            b * t,
            b * t * t,
            b,
        )
        self._mark, self._mark_step, self._clean = now, int(trainer.global_step), True
        self._batches += 1

    # Lightning's hook signature: (trainer, pl_module, outputs, batch, batch_idx)
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bs = batch["labels"].shape[0]
        self._pending[0] += int(batch.get("num_samples", bs))
        self._pending[1] += int(batch["num_tokens"])
        if (batch_idx + 1) % (trainer.log_every_n_steps * trainer.accumulate_grad_batches):
            return
        self._sync(trainer)  # batch_idx is the same on every rank: they all get here together
        pl_module.log(
            "train/samples_seen",
            float(self.samples_seen),
            on_step=True,
            on_epoch=False,
            batch_size=bs,
        )
        for name, value in self.metrics().items():
            pl_module.log(name, value, on_step=True, on_epoch=False, batch_size=bs)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clean = False  # the epoch's last step has no next start to end it
        self._sync(trainer)
        self.train_seconds, self._t_epoch = self.elapsed(), None
        pl_module.log("epoch/samples_seen", float(self.samples_seen))

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clean = False
        self._t_val = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._t_val is not None and self._t_epoch is not None:  # validation inside a train epoch
            self._val_seconds += time.perf_counter() - self._t_val
        self._t_val = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sync(trainer)
        if trainer.is_global_zero and trainer.logger:
            s = self.summary()
            trainer.logger.log_metrics(
                {
                    "final/samples_per_sec": s["samples_per_sec"],
                    "final/tokens_per_sec": s["tokens_per_sec"],
                    "final/samples_seen": float(s["samples_seen"]),
                    **{f"final/{k}": v for k, v in self.metrics().items()},
                },
                step=trainer.global_step,
            )

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._clean = False  # this step's interval holds the save: not a steady-state step
        # every rank saves (Lightning dumps on all, writes on rank 0): totals are exact
        self._sync(trainer)
        checkpoint.setdefault(CHECKPOINT_KEY, {}).update(
            samples_seen=self.samples_seen,
            tokens_seen=self.tokens_seen,
            train_seconds=self.elapsed(),
        )

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        state = checkpoint.get(CHECKPOINT_KEY, {})
        self.samples_seen = int(state.get("samples_seen", 0))
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.train_seconds = float(state.get("train_seconds", 0.0))
