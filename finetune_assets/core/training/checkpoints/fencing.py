"""A fencing token on checkpoint commits: a stale gang's rank can never overwrite a newer gang's
checkpoint.

Two gangs of one run can overlap however carefully the launcher waits: a pod on a node that lost
contact with the API server keeps running until the node is really off (Kubernetes cannot confirm
its death; an admin's ``out-of-service`` taint or a force delete only removes the *object*), so
its rank 0 may still write a checkpoint while the new gang resumes from the same folder. The
launcher therefore gives every gang a generation (``FINETUNE_GANG_GENERATION``, strictly larger
for each new gang of a launch: the launch's wall clock in nanoseconds); the new gang's rank 0
writes it to ``<checkpoint_dir>/fence.json`` before it reads the checkpoint (:func:`raise_fence`),
and every commit first reads the fence (:func:`check_fence`) and is refused, with
:class:`FencedOff`, once a newer generation owns the folder. Without the variable (local runs)
nothing is fenced.

What this does not close: the window between one commit's check and its rename (milliseconds,
against minutes between checkpoints). An object store with conditional writes could close it; a
shared file system has no compare-and-swap across hosts.
"""

from __future__ import annotations

import json
import os
import time

from finetune_assets.core.io.primitives import read_json, write_bytes_atomic

GENERATION_ENV = "FINETUNE_GANG_GENERATION"
FENCE_FILE = "fence.json"


class FencedOff(RuntimeError):
    """A newer gang owns the checkpoint folder: this (stale) rank must not commit."""


def generation() -> int | None:
    """This gang's generation, or None outside a fenced launch."""
    raw = os.environ.get(GENERATION_ENV)
    try:
        return int(raw) if raw else None
    except ValueError:
        raise ValueError(f"{GENERATION_ENV}={raw!r} is not an integer") from None


def _fence_url(folder_url: str) -> str:
    return folder_url.rstrip("/") + "/" + FENCE_FILE


def read_fence(folder_url: str) -> int | None:
    fence = read_json(_fence_url(folder_url), missing=None)
    return None if fence is None else int(fence["generation"])


def raise_fence(folder_url: str, gen: int | None = None) -> None:
    """Rank 0 of a new gang, before it reads the checkpoint: from now on only this generation (or
    a newer one) may commit into ``folder_url``. A gang that finds a newer fence is itself stale.
    """
    gen = generation() if gen is None else gen
    if gen is None:
        return
    held = check_fence(folder_url, gen)
    if held != gen:
        body = json.dumps({"generation": gen, "raised_at": time.time()}).encode()
        write_bytes_atomic(_fence_url(folder_url), body)


def check_fence(folder_url: str, gen: int | None = None) -> int | None:
    """Before a commit into ``folder_url``: raises :class:`FencedOff` when a newer gang owns it;
    else the generation the fence holds (None: no fence, or this process is in no gang).
    """
    gen = generation() if gen is None else gen
    if gen is None:
        return None
    held = read_fence(folder_url)
    if held is not None and held > gen:
        raise FencedOff(_refusal(folder_url, gen, held))
    return held


def _refusal(folder_url: str, gen: int, held: int) -> str:
    return (
        f"checkpoint commit refused: {folder_url} is fenced by a newer gang (generation {held}), "
        f"this rank belongs to generation {gen}: it is a stale rank of a replaced gang (its node "
        "lost contact, or it outlived its Job) and must stop"
    )
