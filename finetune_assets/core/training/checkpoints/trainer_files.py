"""The trainer's files on a local folder or any fsspec URL: scratch space, JSON, published
folders and checkpoints, each written through ``storage_files``' atomic primitives so a killed
writer never leaves a partial file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import fsspec
import torch
import torch.distributed as dist
from fsspec.implementations.local import LocalFileSystem
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.plugins.io import AsyncCheckpointIO

from finetune_assets.core.io.primitives import (
    read_json,  # noqa: F401 - the trainer's callers read JSON from here
    rename_into_place,
    staged_file,
    write_bytes_atomic,
)
from finetune_assets.core.training.checkpoints import fencing


def scratch_root() -> str:
    """Local folder for large derived files (shard cache, model staging, remote checkpoints).

    ``$XDG_CACHE_HOME/finetune_assets``: the Kubernetes launcher points it at the pods' cache
    volume, so these never fill the small ``/tmp`` that also holds HOME. Else the temp dir (local
    runs).
    """
    return os.path.join(
        os.environ.get("XDG_CACHE_HOME") or tempfile.gettempdir(), "finetune_assets"
    )


def is_local(url: str) -> bool:
    fs, _ = fsspec.core.url_to_fs(url)
    return isinstance(fs, LocalFileSystem)


def local_path(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


def write_json_atomic(url: str, obj: Any) -> None:
    write_bytes_atomic(url, json.dumps(obj, indent=2, sort_keys=True).encode())


def exists(url: str) -> bool:
    fs, path = fsspec.core.url_to_fs(url)
    return fs.exists(path)


def node_local_copy(url: str, name: str) -> str:
    """A path every rank of this node can open for ``url``: the path itself when local, else a
    copy local rank 0 downloads once into the scratch folder while the node's other ranks wait.

    FSDP's checkpoint loader takes only a local path (it makes it a ``pathlib.Path``).
    """
    if is_local(url):
        return local_path(url)
    local = os.path.join(scratch_root(), "checkpoints", name)
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        os.makedirs(os.path.dirname(local), exist_ok=True)
        fs, path = fsspec.core.url_to_fs(url)
        fs.get_file(path, local)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return local


def publish_dir(local_dir: Path, url: str) -> None:
    """Move a finished local folder to ``url``: a rename locally, an upload remotely."""
    if is_local(url):
        dst = Path(local_path(url))
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists():
            shutil.rmtree(dst)
        if local_dir.parent == dst.parent:
            rename_into_place(local_dir, dst)
        else:
            shutil.move(str(local_dir), dst)
    else:
        fs, path = fsspec.core.url_to_fs(url)
        fs.put(str(local_dir) + "/", path + "/", recursive=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoints written atomically, so a SIGKILL mid-save keeps the previous
    ``last.ckpt``.

    ``torch.save`` streams into a temp file (beside the target locally, in the scratch folder for a
    remote target, then one upload): the checkpoint is never held in memory a second time.

    ``fence_dir``: the run's checkpoint folder; each commit is refused (``fencing.FencedOff``) once
    a newer gang fenced it, so a stale rank of a replaced gang cannot overwrite its checkpoint.
    """

    def __init__(self, fence_dir: str | None = None) -> None:
        super().__init__()
        self.fence_dir = fence_dir

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} does not take storage_options")
        fence = self.fence_dir
        with staged_file(
            str(path),
            scratch=scratch_root(),
            before_commit=None if fence is None else lambda: fencing.check_fence(fence),
        ) as tmp:
            torch.save(checkpoint, tmp)


def checkpoint_io(checkpoint_dir: str, accelerator: str) -> Any:
    """Atomic writes; on a GPU in a background thread (Lightning's ``AsyncCheckpointIO`` copies the
    state on the device first, then training goes on while rank 0 writes). On CPU the copy and the
    writer would compete with training for the same cores: written in place, as before.
    """
    atomic = AtomicCheckpointIO(fence_dir=checkpoint_dir)
    if accelerator != "cpu" and torch.cuda.is_available():
        return AsyncCheckpointIO(atomic)
    return atomic
