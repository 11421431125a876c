"""The Lightning data module: MDS splits streamed with ``StreamingDataset``; eval split per rank.

Training batches come from :class:`~.streaming_loader.ResumableStreamingDataLoader` (bucketed,
resumable mid-epoch without repeating or skipping samples); the local copies of the shards are
managed by :mod:`.shard_cache`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from streaming import StreamingDataLoader, StreamingDataset
from torch.utils.data import DataLoader, Dataset

from finetune_assets.core.shards.mds import open_streaming_dataset, release_streaming_dataset
from finetune_assets.core.training.config import DataConfig, TrainerConfig
from finetune_assets.core.training.data.collate import PAD_LABEL, DynamicPaddingCollator
from finetune_assets.core.training.data.shard_cache import (
    cache_limit_bytes,
    cache_root,
    clean_stale_streaming_memory,
    num_samples,
    read_index,
    split_locations,
)
from finetune_assets.core.training.data.streaming_loader import (
    ResumableStreamingDataLoader,
    repeated_positions,
)
from finetune_assets.core.training.device_settings import eval_batch_size, on_gpu

log = logging.getLogger("finetune_assets.core.training")

SPLITS = ("train", "validation", "test")


def balanced_class_weights(counts: list[int]) -> list[float]:
    """``n / (classes * count)`` (scikit-learn's "balanced"); a class absent from train gets 1.0."""
    total, k = sum(counts), len(counts)
    if total == 0:
        raise ValueError("class_weights='balanced' needs a non-empty train split")
    return [total / (k * c) if c else 1.0 for c in counts]


class RankBlock(Dataset):
    """This rank's block of an evaluation split, read by index: every sample evaluated exactly once.

    ``StreamingDataset``'s iteration pads every rank to the same length by repeating samples, so a
    confusion matrix summed over ranks counts some test samples twice. Here rank ``r`` reads samples
    ``[r*q, (r+1)*q)`` with ``q = ceil(n / world)`` (a node reads only its ranks' contiguous share
    of the shards); the last ranks are padded to ``q`` with a real sample labelled
    :data:`PAD_LABEL`, which loss and metrics ignore. Every rank still runs the same number of
    steps, as FSDP's per-forward collectives need.
    """

    def __init__(self, dataset: StreamingDataset, rank: int, world: int):
        self.n = int(dataset.num_samples)
        self.dataset, self.per_rank = dataset, -(-self.n // world)
        self.start = min(rank * self.per_rank, self.n)
        self.stop = min(self.start + self.per_rank, self.n)

    def __len__(self) -> int:
        return self.per_rank

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.per_rank:
            raise IndexError(i)
        if self.start + i < self.stop:
            return self.dataset[self.start + i]
        return {**self.dataset[self.n - 1], "label": PAD_LABEL}


def canonical_nodes(config: DataConfig, num_nodes: int) -> int:
    """``num_canonical_nodes`` on ``num_nodes`` nodes: the configured value, else the node count.

    At or above the node count, so each node streams (and caches) only its own share of the shards.
    The value is saved in the loader state of every checkpoint and restored on resume (and a resume
    on another world size is refused), so it stays fixed for the run.
    """
    value = config.num_canonical_nodes or num_nodes
    if value < num_nodes or value % num_nodes:
        raise ValueError(
            f"data.num_canonical_nodes={value} must be a multiple of the node count ({num_nodes}) "
            "and at least it, or each node reads every shard; set it so or leave it unset"
        )
    return value


class MdsDataModule(pl.LightningDataModule):
    """Train / validation / test ``StreamingDataset``s with dynamic-padding batches.

    Split sizes come from each ``index.json`` up front: an empty validation split turns validation
    off, an empty test split skips the test (``run.train`` reports it), an empty train split is an
    error. Evaluation splits are read by index, one contiguous block per rank (:class:`RankBlock`).
    """

    def __init__(
        self,
        config: TrainerConfig,
        pad_token_id: int = 0,
        pad_to: int | None = None,
        run_key: str = "",
        pin_memory: bool = False,
        attempt: str | None = None,
    ):
        super().__init__()
        self.config = config
        self.pin_memory = pin_memory
        self.collate = DynamicPaddingCollator(pad_token_id, config.max_length, pad_to=pad_to)
        self.datasets: dict[str, StreamingDataset] = {}
        self._train_loader: ResumableStreamingDataLoader | None = None
        self.indexes = {split: read_index(self.url(split), split) for split in SPLITS}
        self.sizes = {split: num_samples(index) for split, index in self.indexes.items()}
        if not self.sizes["train"]:
            raise ValueError(
                f"train split at {config.data.train_url} has no samples: nothing to train on"
            )
        key = json.dumps({"run": run_key, "indexes": self.indexes}, sort_keys=True)
        self.cache_dir, self._owned_cache = cache_root(config.data, key, attempt)

    def url(self, split: str) -> str:
        return getattr(self.config.data, f"{split}_url")

    def is_empty(self, split: str) -> bool:
        return self.sizes[split] == 0

    def _world(self) -> tuple[int, int, int]:
        """(rank, world size, nodes) from the trainer, or a single process without one."""
        if self.trainer is None:
            return 0, 1, 1
        return self.trainer.global_rank, self.trainer.world_size, max(1, self.trainer.num_nodes)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        # Segments left by a killed run make the next StreamingDataset fail ("Reused local
        # directory"): local rank 0 removes the unused ones while the other ranks wait.
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:
            clean_stale_streaming_memory()
            self.remove_earlier_attempts()
            self._check_free_space()
        if self.trainer is not None:
            self.trainer.strategy.barrier("mds-shm")
        for split in SPLITS:
            if not self.is_empty(split):  # streaming cannot open a split without shards
                self.datasets[split] = self._dataset(split)

    def _limits(self) -> dict[str, int]:
        nodes = self._world()[2]
        return {
            split: cache_limit_bytes(self.indexes[split], nodes)
            for split in SPLITS
            if not self.is_empty(split)
        }

    def _check_free_space(self) -> None:
        """Fail before any download if the cache cannot hold this node's share of the shards."""
        os.makedirs(self.cache_dir, exist_ok=True)
        need, free = sum(self._limits().values()), shutil.disk_usage(self.cache_dir).free
        if need > free:
            raise OSError(
                f"shard cache {self.cache_dir}: this node needs up to {need} bytes, {free} are "
                "free; give the cache volume more room (the k8s launcher's scratch_size) or set "
                "data.local_cache_dir to a larger local folder"
            )

    def cached_shards(self, split: str) -> int:
        """Shards of ``split`` decompressed in this node's cache (each node: about its share)."""
        return len(list(Path(self.cache_dir, split).glob("shard.*.mds")))

    def remove_earlier_attempts(self) -> list[str]:
        """Delete the caches earlier attempts of this run left on this node (the local leader, at
        start); the removed folders.

        Each attempt (restart) caches into its own folder (``shard_cache.cache_root``); a killed
        attempt never removes its own, so repeated in-pod restarts on a large dataset would fill
        the disk. Every rank of this start shares one attempt token, so any other attempt folder of
        this run belongs to a worker group that no longer runs.
        """
        if not self._owned_cache or not os.path.isdir(self._owned_cache):
            return []
        mine = os.path.realpath(self.cache_dir)
        removed = []
        for entry in os.scandir(self._owned_cache):
            if entry.is_dir(follow_symlinks=False) and os.path.realpath(entry.path) != mine:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
        if removed:
            log.warning("removed %d shard cache(s) of earlier attempts: %s", len(removed), removed)
        return removed

    def release(self) -> None:
        """Free the datasets' shared memory (every rank, once none reads them any more): streaming
        holds it until the process exits, which a tuning worker or an in-process run does not.
        """
        for dataset in self.datasets.values():
            release_streaming_dataset(dataset)
        self.datasets.clear()

    def remove_cache(self) -> None:
        """Delete the derived cache folder (one process per node, after every rank is done)."""
        if self._owned_cache:
            shutil.rmtree(self._owned_cache, ignore_errors=True)

    def _dataset(self, split: str) -> StreamingDataset:
        c = self.config
        remote, local = split_locations(self.url(split), self.cache_dir, split)
        train = split == "train"
        batch_size = c.batch_size * (c.bucket_batches if train else 1)
        nodes = canonical_nodes(c.data, self._world()[2])
        return open_streaming_dataset(
            remote=remote,
            local=local,
            # per device, equal to what the DataLoader reads at once (a bucketing window for train)
            batch_size=batch_size,
            shuffle=c.shuffle and train,
            shuffle_seed=c.data.shuffle_seed,
            num_canonical_nodes=nodes,
            download_retry=c.data.download_retry,
            # streaming's own defaults, given explicitly: it logs a notice per dataset for each
            # one left unset
            predownload=c.data.predownload if c.data.predownload is not None else 8 * batch_size,
            shuffle_block_size=max(4_000_000 // nodes, 1 << 18),
            cache_limit=self._limits()[split],
        )

    def _loader_kwargs(self) -> dict[str, Any]:
        c = self.config
        # None only when nothing resolved it (run.train does: device_settings.resolve)
        workers = c.num_workers or 0
        kwargs: dict[str, Any] = dict(
            num_workers=workers, pin_memory=self.pin_memory, drop_last=False
        )
        if workers > 0:  # llm-foundry's set-up: workers stay up across epochs and read ahead
            kwargs.update(persistent_workers=True, prefetch_factor=c.data.prefetch_factor)
        return kwargs

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world, _ = self._world()
        block = RankBlock(self.datasets[split], rank, world)
        return DataLoader(
            block,
            batch_size=eval_batch_size(
                self.config.batch_size,
                self.config.eval_batch_size,
                on_gpu(self.config.accelerator),
            ),
            shuffle=False,
            collate_fn=self.collate,
            **self._loader_kwargs(),
        )

    def train_dataloader(self) -> StreamingDataLoader:
        c = self.config
        world = self._world()[1]
        epoch_fn = (lambda: self.trainer.current_epoch) if self.trainer is not None else (lambda: 0)
        dataset = self.datasets["train"]
        rank, _, nodes = self._world()
        repeated = repeated_positions(
            dataset.num_samples,
            canonical_nodes(c.data, nodes),
            nodes,
            world // nodes,
            rank,
            c.batch_size * c.bucket_batches,
            dataset.partition_algo,
        )
        self._train_loader = ResumableStreamingDataLoader(
            dataset,
            batch_size=c.batch_size,
            collate_fn=self.collate,
            epoch_fn=epoch_fn,
            world_size=world,
            bucket_batches=c.bucket_batches,
            seed=c.data.shuffle_seed,
            repeated=repeated,
            num_nodes=nodes,
            shared_order=c.data.bucket_order == "shared",
            **self._loader_kwargs(),
        )
        return self._train_loader

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Runs once per batch the training step is about to consume (after the pre-fetch).
        if self.trainer is not None and self.trainer.training and self._train_loader is not None:
            self._train_loader.mark_consumed(int(batch["labels"].shape[0]))
        return batch
