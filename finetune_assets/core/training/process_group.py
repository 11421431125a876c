"""Joining the process group and exchanging small values across ranks (torchrun's environment).

After torchrun restarts a worker group the agent's store still holds the previous start's keys, so
every start joins under a prefix that all its ranks agree on first (:func:`agree_on_attempt`).
"""

from __future__ import annotations

import datetime
import logging
import os
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import _torchelastic_use_agent_store

from finetune_assets.core.training.config import TrainerConfig

log = logging.getLogger("finetune_assets.core.training")


def torchrun_world() -> tuple[int, int, int]:
    """(rank, world size, local world size) from torchrun's environment; one process without it."""
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
    )


ATTEMPT_KEYS = "/finetune_assets/attempt"


def agree_on_attempt(
    store: Any, rank: int, world: int, timeout: float = 1800.0, poll: float = 0.05
) -> str:
    """A token that every rank of this start of the worker group gets, and no earlier start had.

    The agent's store outlives worker restarts, so the process group's keys must sit under a prefix
    that is fresh per start and equal on every node. ``TORCHELASTIC_RESTART_COUNT`` is not: it
    counts one node agent's own restarts, so after one node's workers fail the nodes disagree and
    never meet. Instead rank 0 draws a token and hands it to each rank that asks with a fresh nonce
    (stale asks left by a previous start are answered harmlessly); it returns once every rank has
    acknowledged *this* token, which no earlier start could have done.
    """
    if rank != 0:
        nonce = uuid.uuid4().hex
        store.set(f"{ATTEMPT_KEYS}/ask/{rank}", nonce)
        answer = f"{ATTEMPT_KEYS}/answer/{nonce}"
        store.wait([answer], datetime.timedelta(seconds=timeout))
        token = store.get(answer).decode()
        store.set(f"{ATTEMPT_KEYS}/ack/{token}/{rank}", "1")
        return token
    token = uuid.uuid4().hex
    waiting, answered = set(range(1, world)), {}
    deadline = time.monotonic() + timeout
    while waiting:
        for r in sorted(waiting):
            if store.check([f"{ATTEMPT_KEYS}/ack/{token}/{r}"]):
                waiting.discard(r)
            elif store.check([f"{ATTEMPT_KEYS}/ask/{r}"]):
                nonce = store.get(f"{ATTEMPT_KEYS}/ask/{r}").decode()
                if answered.get(r) != nonce:
                    store.set(f"{ATTEMPT_KEYS}/answer/{nonce}", token)
                    answered[r] = nonce
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(
                f"ranks {sorted(waiting)} did not join the process group within {timeout:.0f}s"
            )
        time.sleep(poll if waiting else 0)
    return token


def init_process_group(config: TrainerConfig) -> str | None:
    """Join the process group through a store prefix unique to this start of the worker group.

    After torchrun restarts a worker group, the agent's store still holds the previous attempt's
    keys; gloo then reads a dead rank's address and fails with "connectFullMesh ... Connection
    refused" when the new ranks start at different speeds. Keys under the token of
    :func:`agree_on_attempt` are always fresh, on every node. Lightning sees the group initialised
    and uses it. Returns the token (None outside a multi-process torchrun).
    """
    rank, world, _ = torchrun_world()
    if world == 1 or "TORCHELASTIC_RUN_ID" not in os.environ or dist.is_initialized():
        return None
    timeout = datetime.timedelta(minutes=30)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0 and not _torchelastic_use_agent_store(),
        timeout=timeout,
    )
    token = agree_on_attempt(store, rank, world, timeout=timeout.total_seconds())
    log.info(
        "rank %d joins attempt %s (this node's restart count %s)",
        rank,
        token[:8],
        os.environ.get("TORCHELASTIC_RESTART_COUNT"),
    )
    gpu = config.accelerator != "cpu" and torch.cuda.is_available()
    dist.init_process_group(
        "nccl" if gpu else "gloo",
        store=dist.PrefixStore(f"/finetune_assets/{token}", store),
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
    return token


def per_node(value: Any) -> list[Any]:
    """``value`` of each node's local leader (others pass None), in node order: one all-gather."""
    return [v for v in gather(value) if v is not None]


def gather(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (one all-gather; ``[value]`` without a group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
