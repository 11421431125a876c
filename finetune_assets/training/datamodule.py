"""MDS splits streamed with ``StreamingDataset``; resumable mid-epoch without repeating or skipping samples.

Lightning saves a stateful train loader in its checkpoints and restores it on a mid-epoch restart,
but its fetcher pre-fetches a batch, so ``StreamingDataLoader.num_samples_yielded`` runs ahead of
what the model consumed and a resume would skip samples. :class:`ResumableStreamingDataLoader`
records the batches the training loop actually took (``on_after_batch_transfer``), and pins the
dataset's epoch to Lightning's so a restart at an epoch boundary sees the uninterrupted shuffle.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from streaming import StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory
from torch.utils.data import DataLoader, Dataset

from finetune_assets.data.shards import open_streaming_dataset
from finetune_assets.training import files
from finetune_assets.training.collate import DynamicPaddingCollator
from finetune_assets.training.config import DataConfig, TrainerConfig

SPLITS = ("train", "validation", "test")
log = logging.getLogger(__name__)
PAD_LABEL = (
    -100
)  # cross-entropy's and torchmetrics' ignore_index: a padding or repeated sample counts nowhere


class WindowCollator:
    """One loader *window* (``bucket_batches`` batches of samples) -> its collated batches, in a loader worker.

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

    A function of (seed, epoch, window number) only, so at each step all ranks run their batch of the
    same length rank (no rank waits for another's longer bucket), and a resume that re-reads the
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
    from streaming.base.partition import get_partitions

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
    """A ``StreamingDataLoader`` that resumes at the exact batch the model last consumed, with optional bucketing.

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
        # Windows are bucketed and collated inside the loader's workers (pinned by the DataLoader when asked).
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
        self._resume_point = (
            0,
            0,
        )  # (samples of this rank before the window, batches consumed in it)
        self.num_samples_consumed = 0

    def __len__(self) -> int:
        # Batches per epoch (as without windows): Lightning ends an epoch after this many.
        return math.ceil(len(self.dataset) / self.per_device_batch)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        dataset: StreamingDataset = self.dataset  # type: ignore[assignment]
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
            if (
                self._shared_order
            ):  # the window's number in this rank's epoch stream: the same on every rank
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
        """Label streaming's repeated samples :data:`PAD_LABEL` (no loss, not counted): each trains once."""
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


def balanced_class_weights(counts: list[int]) -> list[float]:
    """``n / (classes * count)`` (scikit-learn's "balanced"); a class absent from train gets 1.0 (never a target)."""
    total, k = sum(counts), len(counts)
    if total == 0:
        raise ValueError("class_weights='balanced' needs a non-empty train split")
    return [total / (k * c) if c else 1.0 for c in counts]


_STREAMING_SHM = re.compile(r"\d{6}_\w+")  # streaming's segment names: f"{prefix:06}_{name}"


def clean_stale_streaming_memory() -> int:
    """Unlink streaming's shared-memory segments that no live process maps or holds open; how many.

    A SIGKILLed run leaves its segments behind, naming its local folders. streaming's own
    ``clean_stale_shared_memory()`` unlinks *every* segment from prefix 0 up to the first gap, the
    live ones of other trainings on this machine included, and misses stale ones after a gap. This
    looks at ``/proc`` instead (Linux; elsewhere it falls back to streaming's function).
    """
    shm = Path("/dev/shm")
    if not shm.is_dir() or not Path("/proc/self/maps").exists():
        clean_stale_shared_memory()
        return 0
    names = {p.name for p in shm.iterdir() if _STREAMING_SHM.fullmatch(p.name)}
    if not names:
        return 0
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    used.add(line.split("/dev/shm/", 1)[1].split()[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/") :].split()[0])
        except OSError:  # the process ended, or is not ours to inspect
            continue
    stale = names - used
    for name in stale:
        (shm / name).unlink(missing_ok=True)
    return len(stale)


def read_index(url: str, split: str) -> dict[str, Any]:
    """The split's MDS ``index.json`` (local path or fsspec URL); a clear error when there is none."""
    import json

    import fsspec

    path = f"{files.local_path(url).rstrip('/')}/index.json"
    try:
        with fsspec.open(path, "r") as f:
            return json.load(f)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{split} split: no MDS dataset (index.json) at {url}") from err
    except ValueError as err:
        raise ValueError(f"{split} split: {path} is not valid JSON: {err}") from err


def num_samples(index: dict[str, Any]) -> int:
    return sum(int(shard.get("samples", 0)) for shard in index.get("shards", []))


def cache_limit_bytes(index: dict[str, Any], num_nodes: int) -> int:
    """A split's ``cache_limit`` on one node, sized from its index: this node's share of the shards.

    Training partitions samples over canonical nodes (contiguous ranges, at least one per node) and
    evaluation reads one contiguous block per rank, so a node touches about ``1/num_nodes`` of the
    shards; on top: the index, the shards straddling its range's two ends and streaming's minimum of
    four of the largest shard (raw + zip) while one downloads and decompresses.
    """
    shards = index.get("shards", [])
    sizes = [
        int((s.get("raw_data") or {}).get("bytes", 0))
        + int((s.get("zip_data") or {}).get("bytes", 0))
        for s in shards
    ]
    if not sizes:
        return 0
    index_bytes = len(json.dumps(index)) + 1024
    return index_bytes + math.ceil(sum(sizes) / max(1, num_nodes)) + 6 * max(sizes)


def cache_root(
    config: DataConfig, run_key: str, attempt: str | None = None
) -> tuple[str, str | None]:
    """(folder, folder to remove after success or None) for the local copies of the splits.

    ``config.local_cache_dir`` when set (kept: the caller owns it). Otherwise
    ``{scratch}/mds-cache/{hash of run_key}/{attempt}`` where ``{scratch}`` is :func:`files.scratch_root`
    (the pods' cache volume, not the small ``/tmp`` that also holds HOME): ``run_key`` (the checkpoint dir
    and the splits' indexes) separates runs and shard versions, and ``attempt`` (the token every rank
    of this start of the worker group agreed on, see ``run.agree_on_attempt``; else run id + this
    agent's restart count, which stays the same when an agent restarts its workers for another
    node's failure) separates restarts. A SIGKILLed worker
    leaves its streaming shared memory behind, naming its local folders; reusing those folders in
    the next attempt fails with "Reused local directory", so every attempt gets fresh ones. The
    trainer removes the run's folder (with what killed attempts left) after a successful run.
    """
    if config.local_cache_dir:
        return files.local_path(config.local_cache_dir), None
    run = hashlib.sha256(run_key.encode()).hexdigest()[:16]
    if attempt is not None:
        pass
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        attempt = f"{os.environ['TORCHELASTIC_RUN_ID']}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    else:  # one process outside torchrun (tests, benchmarks): each call is its own attempt
        attempt = f"pid-{os.getpid()}-{uuid.uuid4().hex}"
    run_dir = os.path.join(files.scratch_root(), "mds-cache", run)
    return os.path.join(run_dir, hashlib.sha256(attempt.encode()).hexdigest()[:12]), run_dir


def split_locations(url: str, cache_dir: str, split: str) -> tuple[str, str]:
    """(remote, local) for one split: the published folder or URL is always the *remote*.

    Read in place (``remote=None``), streaming would decompress ``.mds.zstd`` shards into the
    published folder itself, changing published data and failing on a read-only volume; so every
    split is copied (decompressed) into its own ``local`` cache sub-folder instead.
    """
    url = files.local_path(url)
    if "://" not in url and not Path(url, "index.json").exists():
        raise FileNotFoundError(f"{split} split: no MDS dataset (index.json) at {url}")
    return url, os.path.join(cache_dir, split)


class RankBlock(Dataset):
    """This rank's block of an evaluation split, read by index: every sample evaluated exactly once.

    ``StreamingDataset``'s iteration pads every rank to the same length by repeating samples, so a
    confusion matrix summed over ranks counts some test samples twice. Here rank ``r`` reads samples
    ``[r*q, (r+1)*q)`` with ``q = ceil(n / world)`` (a node reads only its ranks' contiguous share of
    the shards); the last ranks are padded to ``q`` with a real sample labelled :data:`PAD_LABEL`,
    which loss and metrics ignore. Every rank still runs the same number of steps, as FSDP's
    per-forward collectives need.
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
    """``num_canonical_nodes`` for a run on ``num_nodes`` nodes: the configured value or the node count.

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
    off, an empty test split skips the test (``run.train`` reports it), an empty train split is an error.
    Evaluation splits are read by index, one contiguous block per rank (:class:`RankBlock`).
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
        # Segments left by a killed run make the next StreamingDataset fail ("Reused local directory"):
        # local rank 0 removes the unused ones while the other ranks wait.
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:
            clean_stale_streaming_memory()
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
        """Fail before any download when the cache folder cannot hold this node's share of the shards."""
        os.makedirs(self.cache_dir, exist_ok=True)
        need, free = sum(self._limits().values()), shutil.disk_usage(self.cache_dir).free
        if need > free:
            raise OSError(
                f"shard cache {self.cache_dir}: this node needs up to {need} bytes, {free} are free; "
                "give the cache volume more room (the k8s launcher's scratch_size) or set "
                "data.local_cache_dir to a larger local folder"
            )

    def cached_shards(self, split: str) -> int:
        """Shards of ``split`` now decompressed in this node's cache (each node should hold about its share)."""
        return len(list(Path(self.cache_dir, split).glob("shard.*.mds")))

    def remove_cache(self) -> None:
        """Delete the derived cache folder (call on one process per node, after every rank is done)."""
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
            # streaming's own defaults, given explicitly: it logs a notice per dataset for each one left unset
            predownload=c.data.predownload if c.data.predownload is not None else 8 * batch_size,
            shuffle_block_size=max(4_000_000 // nodes, 1 << 18),
            cache_limit=self._limits()[split],
        )

    def _loader_kwargs(self) -> dict[str, Any]:
        c = self.config
        kwargs: dict[str, Any] = dict(
            num_workers=c.num_workers, pin_memory=self.pin_memory, drop_last=False
        )
        if c.num_workers > 0:  # llm-foundry's set-up: workers stay up across epochs and read ahead
            kwargs.update(persistent_workers=True, prefetch_factor=c.data.prefetch_factor)
        return kwargs

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world, _ = self._world()
        block = RankBlock(self.datasets[split], rank, world)
        return DataLoader(
            block,
            batch_size=self.config.batch_size,
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
