"""Whether a training run resumes, and from which local copy of its checkpoint.

Rank 0 decides for every rank (a rank that cannot see the checkpoint is an error, not a hang), after
fencing off the gang it replaces and putting back a sharded checkpoint whose swap broke off; every
rank then reads a node-local copy that loads weights-only (pickled code is refused).
"""

from __future__ import annotations

import logging
import os

import fsspec
import torch
import torch.distributed as dist

from finetune_assets.core.training.checkpoints import fencing
from finetune_assets.core.training.checkpoints import trainer_files as files
from finetune_assets.core.training.checkpoints.best import BEST, BEST_DIR
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.data import sharding
from finetune_assets.core.training.process_group import gather

log = logging.getLogger("finetune_assets.core.training")

LAST = "last.ckpt"


def last_checkpoint(config: TrainerConfig) -> str:
    """``{checkpoint_dir}/last.ckpt``: written at each checkpoint and once more at the end."""
    return f"{files.local_path(config.checkpoint_dir)}/{LAST}"


def resume_decision(exists_per_rank: list[bool]) -> bool:
    """Rank 0 decides whether the run resumes (every rank sees this same list, one all-gather).

    Each rank deciding alone, on node-local checkpoint storage node 0 resumed and waited in a
    barrier while node 1 started fresh (a 30-minute hang). A rank that cannot see the checkpoint
    rank 0 resumes from is an error on every rank, not a hang.
    """
    if not exists_per_rank[0]:
        return False
    blind = [rank for rank, seen in enumerate(exists_per_rank) if not seen]
    if blind:
        raise FileNotFoundError(
            f"rank 0 resumes from {LAST} in checkpoint_dir, but ranks {blind} cannot see it: "
            "checkpoint_dir must be storage every node reads (a shared volume or an object store "
            "URL), not a node-local folder"
        )
    return True


def resume_point(config: TrainerConfig, rank: int) -> str | None:
    """The checkpoint every rank resumes from, None for a fresh start (a collective).

    Before anyone reads it, rank 0 raises the fence (a replaced gang's ranks commit no more) and
    puts back a sharded checkpoint whose swap a killed save left half done.
    """
    last = last_checkpoint(config)
    if rank == 0:
        fencing.raise_fence(config.checkpoint_dir)
    best = f"{files.local_path(config.checkpoint_dir)}/{BEST_DIR}/{BEST}.ckpt"
    for saved in (last, best) if rank == 0 and files.is_local(last) else ():
        if sharding.recover_swap(saved):
            log.warning("%s: the previous sharded checkpoint put back (a save broke off)", saved)
    gather(None)  # every rank looks after the recovery
    resume = last if resume_decision(gather(files.exists(last))) else None
    if resume and rank == 0:
        log.warning("resuming from %s", resume)
    return resume


def local_resume(resume: str | None) -> str | None:
    """The checkpoint to hand Lightning: a node-local copy, refused unless it loads weights-only.

    A remote checkpoint (``s3://``) is downloaded once per node, by local rank 0 into the scratch
    folder, while the node's other ranks wait; they all read that copy (not one download per rank of
    a multi-GB file). The FSDP loader also needs a local path: it makes the path a ``pathlib.Path``.
    """
    if resume is None:
        return resume
    if sharding.is_sharded_checkpoint(files.local_path(resume)):  # a DCP folder (local by config)
        meta = os.path.join(files.local_path(resume), sharding.META)
        torch.load(meta, map_location="cpu", weights_only=True)  # raises on pickled code
        return files.local_path(resume)

    local = resume if files.is_local(resume) else os.path.join(files.scratch_root(), "resume", LAST)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        if local != resume:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            fs, path = fsspec.core.url_to_fs(resume)
            fs.get_file(path, local)
        # raises on pickled code
        torch.load(local, map_location="cpu", weights_only=True, mmap=True)
    if dist.is_initialized():
        dist.barrier()
    return files.local_path(local)
