"""The train loader: length-bucketed windows, one batch order on all ranks, exact resume.

Lightning saves a stateful train loader in its checkpoints and restores it on a mid-epoch restart,
but its fetcher pre-fetches a batch, so ``StreamingDataLoader.num_samples_yielded`` runs ahead of
what the model consumed and a resume would skip samples. :class:`ResumableStreamingDataLoader`
records the batches the training loop actually took (``on_after_batch_transfer``), and pins the
dataset's epoch to Lightning's so a restart at an epoch boundary sees the uninterrupted shuffle.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from streaming import StreamingDataLoader, StreamingDataset
from streaming.base.partition import get_partitions
from torch.utils.data import DataLoader

from finetune_assets.core.training.data.collate import PAD_LABEL


class WindowCollator:
    """One loader *window* (``bucket_batches`` batches of samples) -> its collated batches.

    With bucketing the window is sorted by length and cut into batches, shortest first; the loader
    then runs them in an order every rank shares (:func:`bucket_order`). ``per_rank`` is the old
    order, kept for the benchmark: each rank shuffles its batches with a seed drawn from its own
    window's content, so at one step the ranks run different lengths and wait for the longest.
    """

    def __init__(
        self,
        collate: Callable[[list[dict[str, Any]]], Any],
        batch_size: int,
        bucket_batches: int,
        seed: int,
        per_rank: bool = False,
    ):
        self.collate, self.batch_size, self.bucket_batches, self.seed = (
            collate,
            batch_size,
            bucket_batches,
            seed,
        )
        self.per_rank = per_rank

    def __call__(self, window: list[dict[str, Any]]) -> list[Any]:
        b = self.batch_size
        order = list(range(len(window)))  # each row's position in the window (the stream order)
        if self.bucket_batches > 1:
            order.sort(key=lambda i: len(window[i]["input_ids"]))
        batches = [order[i : i + b] for i in range(0, len(order), b)]
        if self.bucket_batches > 1 and self.per_rank:
            digest = hashlib.blake2b(digest_size=8)
            for sample in window:
                digest.update(bytes(memoryview(sample["input_ids"]).cast("B")))
            random.Random(f"{self.seed}/{digest.hexdigest()}").shuffle(batches)
        out = []
        for rows in batches:
            batch = self.collate([window[i] for i in rows])
            batch["window_index"] = torch.tensor(rows, dtype=torch.long)
            out.append(batch)
        return out


def bucket_order(count: int, seed: int, epoch: int, window: int) -> list[int]:
    """The order in which a window's length-sorted batches run: the same on every rank.

    A function of (seed, epoch, window number) only, so at each step all ranks run their batch of
    the same length rank (no rank waits for another's longer bucket), and a resume that re-reads the
    window rebuilds the same order.
    """
    order = list(range(count))
    random.Random(f"{seed}/{epoch}/{window}").shuffle(order)
    return order


def repeated_positions(
    num_samples: int,
    canonical: int,
    nodes: int,
    ranks_per_node: int,
    rank: int,
    window: int,
    algo: str = "relaxed",
) -> np.ndarray:
    """Which positions of ``rank``'s epoch stream repeat a sample that another position already has.

    ``StreamingDataset`` gives every rank the same number of samples by repeating some when the
    split does not divide evenly. Positions do not depend on the shuffle (a permutation of sample
    ids applied after partitioning) nor on the epoch, so streaming's own partition of ``range(n)``
    says where the repeats are: an id's first occurrence in training order (window, node, rank,
    slot) counts, the others are masked out of loss and counts. A resume at ``c`` samples per rank
    continues the same stream from position ``c``.
    """
    plan = get_partitions(algo, num_samples, canonical, nodes, ranks_per_node, 1, window)[:, :, 0]
    order = plan.transpose(2, 0, 1, 3)  # (window index, node, rank of node, slot): training order
    flat = order.reshape(-1)
    valid = flat >= 0
    first = np.zeros(flat.shape, dtype=bool)
    at = np.flatnonzero(valid)
    first[at[np.unique(flat[at], return_index=True)[1]]] = True
    repeated = (valid & ~first).reshape(order.shape)
    node, local = divmod(rank, ranks_per_node)
    mine, mine_valid = (
        repeated[:, node, local].reshape(-1),
        valid.reshape(order.shape)[:, node, local].reshape(-1),
    )
    return mine[mine_valid]  # streaming skips the -1 fillers, all at the end of a rank's stream


class ResumableStreamingDataLoader(StreamingDataLoader):
    """A ``StreamingDataLoader`` resuming at the batch the model last consumed; bucketing optional.

    The underlying loader reads *windows* of ``bucket_batches * batch_size`` samples. With bucketing
    (``bucket_batches > 1``) a window is sorted by length, cut into batches (less padding) and the
    batches are shuffled with a seed derived from the window's content, so they are reproducible.
    The state names the window's first sample plus how many of its batches were consumed, so a
    resume re-reads that window, rebuilds the same batches and skips the consumed ones: no sample
    repeats or goes missing, with or without bucketing.
    """

    def __init__(
        self,
        dataset: StreamingDataset,
        *,
        batch_size: int,
        collate_fn: Callable[[list[dict[str, Any]]], Any],
        epoch_fn: Callable[[], int],
        world_size: int,
        bucket_batches: int = 1,
        seed: int = 0,
        repeated: np.ndarray | None = None,
        num_nodes: int = 1,
        shared_order: bool = True,
        **kwargs: Any,
    ):
        if bucket_batches < 1:
            raise ValueError(f"bucket_batches must be >= 1, got {bucket_batches}")
        # Windows are bucketed and collated inside the loader's workers (pinned by the
        # DataLoader when asked).
        windows = WindowCollator(
            collate_fn, batch_size, bucket_batches, seed, per_rank=not shared_order
        )
        self._seed, self._shared_order = seed, shared_order and bucket_batches > 1
        super().__init__(
            dataset, batch_size=batch_size * bucket_batches, collate_fn=windows, **kwargs
        )
        self.per_device_batch = batch_size
        self.bucket_batches = bucket_batches
        self._epoch_fn = epoch_fn
        self._world_size = world_size
        self._repeated = repeated  # repeated_positions() of this rank, or None: count every sample
        self._num_nodes = num_nodes
        self._pending: dict[str, Any] | None = None
        self._inflight: deque[tuple[int, int, int, int]] = deque()
        self._epoch = 0
        self._base = 0  # global sample_in_epoch where this iteration started
        # (samples of this rank before the window, batches consumed in it)
        self._resume_point = (0, 0)
        self.num_samples_consumed = 0

    def __len__(self) -> int:
        # Batches per epoch (as without windows): Lightning ends an epoch after this many.
        return math.ceil(len(self.dataset) / self.per_device_batch)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        dataset: StreamingDataset = self.dataset  # type: ignore[assignment]
        if self._pending is not None and int(self._pending.get("epoch", -1)) != self._epoch_fn():
            # a state saved at the end of an epoch that is over: the next one starts afresh
            self._pending = None
        if self._pending is not None:
            state, self._pending = self._pending, None
        else:  # a fresh epoch: align the dataset's epoch (and so its shuffle) with Lightning's
            # Built here, not read with dataset.state_dict(): that reads the node's shared resume
            # buffer, which another local rank may have created but not yet written (empty JSON).
            state = {
                "epoch": self._epoch_fn(),
                "sample_in_epoch": 0,
                "num_canonical_nodes": dataset.num_canonical_nodes or self._num_nodes,
                "shuffle_seed": dataset.shuffle_seed,
                "initial_physical_nodes": dataset.initial_physical_nodes or self._num_nodes,
            }
        skip = int(state.pop("skip_batches", 0))
        dataset.load_state_dict(state)
        self._epoch, self._base = int(state["epoch"]), int(state["sample_in_epoch"])
        self._inflight.clear()
        self._resume_point = (0, skip)
        self.num_samples_consumed = 0
        offset = 0
        window_samples = self.per_device_batch * self.bucket_batches
        for w, batches in enumerate(DataLoader.__iter__(self)):
            size = sum(len(batch["labels"]) for batch in batches)
            # the window's number in this rank's epoch stream: the same on every rank
            if self._shared_order:
                number = (self._base // self._world_size + offset) // window_samples
                batches = [
                    batches[k] for k in bucket_order(len(batches), self._seed, self._epoch, number)
                ]
            for j, batch in enumerate(batches):
                rows = batch.pop("window_index")
                if w == 0 and j < skip:
                    continue
                self._mask_repeats(batch, self._base // self._world_size + offset + rows.numpy())
                self._inflight.append((offset, size, j, len(batches)))
                yield batch
            offset += size

    def _mask_repeats(self, batch: dict[str, Any], positions: np.ndarray) -> None:
        """Mark streaming's repeats :data:`PAD_LABEL` (no loss, not counted): each trains once."""
        if self._repeated is None:
            return
        inside = positions < len(self._repeated)
        mask = np.zeros(len(positions), dtype=bool)
        mask[inside] = self._repeated[positions[inside]]
        if mask.any():
            rows = torch.from_numpy(mask)
            batch["labels"][rows] = PAD_LABEL
            batch["num_samples"] -= int(mask.sum())
            batch["num_tokens"] -= int(batch["attention_mask"][rows].sum())

    def mark_consumed(self, num_samples: int) -> None:
        """Called once per batch the training step takes, in order (after Lightning's pre-fetch)."""
        offset, size, j, count = self._inflight.popleft()
        self._resume_point = (offset + size, 0) if j + 1 == count else (offset, j + 1)
        self.num_samples_consumed += num_samples

    def state_dict(self) -> dict[str, Any]:
        dataset: StreamingDataset = self.dataset  # type: ignore[assignment]
        offset, skip = self._resume_point
        state = dataset.state_dict(self._base + offset * self._world_size, from_beginning=True)
        state["epoch"] = self._epoch
        state["skip_batches"] = skip
        return state

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        self._pending = dict(obj)  # applied when the next epoch iterator starts
