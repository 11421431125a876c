"""The process layout a checkpoint records, and the check that a resume keeps it.

Which samples each rank streams (and so which repeats are masked), the global batch and the LR
schedule's step count all depend on the world size, the node count, streaming's canonical nodes and
the batch per device. A checkpoint resumed on another layout is refused, naming how to relaunch,
instead of being silently re-planned; only at an epoch's end may the world size change.
"""

from __future__ import annotations

import logging
from typing import Any

from finetune_assets.core.training.data.datamodule import canonical_nodes

log = logging.getLogger(__name__)


class LayoutChanged(RuntimeError):
    """A checkpoint resumed on another process layout than wrote it (refused, not silently
    re-planned).
    """


class WorldSizeChanged(LayoutChanged):
    """A checkpoint resumed by a different number of processes than wrote it."""


def layout_of(trainer: Any) -> dict[str, int]:
    """World size, nodes and streaming's canonical nodes: what the data order and repeat mask
    depend on.
    """
    nodes = max(1, int(getattr(trainer, "num_nodes", 1) or 1))
    datamodule = getattr(trainer, "datamodule", None)
    layout = {"world_size": int(trainer.world_size), "num_nodes": nodes}
    if datamodule is not None and hasattr(datamodule, "config"):
        layout["num_canonical_nodes"] = canonical_nodes(datamodule.config.data, nodes)
        layout["batch_size"] = int(datamodule.config.batch_size)  # as resolved on this device
    return layout


def at_epoch_end(checkpoint: dict[str, Any], trainer: Any) -> bool:
    """Whether the checkpoint's train stream had consumed its whole epoch (the only point where
    the data order does not depend on the world size that wrote it).
    """
    loops = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
    loaders = loops.get("combined_loader") or []
    datamodule = getattr(trainer, "datamodule", None)
    sizes = getattr(datamodule, "sizes", None)
    if not loaders or not sizes:
        return False
    stream = loaders[0]
    return (
        int(stream.get("sample_in_epoch", 0)) >= sizes["train"]
        and int(stream.get("skip_batches", 0)) == 0
    )


def check_resume_layout(saved: dict[str, Any], trainer: Any, checkpoint: dict[str, Any]) -> None:
    """Raise :class:`LayoutChanged` when this run's layout differs from the one the checkpoint
    recorded (``saved``; a key missing from an older checkpoint is not checked).

    At an epoch's end a different world size is allowed: the weights and optimizer reshard (DCP,
    or a full state) and the next epoch starts afresh on the new layout.
    """
    now = layout_of(trainer)
    world = saved.get("world_size")
    if world is not None and int(world) != now["world_size"]:
        if at_epoch_end(checkpoint, trainer):
            # the global batch (and so the remaining steps and the LR schedule's total) follows
            # the new world size
            log.warning(
                "resuming at an epoch's end on %d processes (written by %s): the next epoch "
                "starts on the new layout",
                now["world_size"],
                world,
            )
            return
        raise WorldSizeChanged(
            f"the checkpoint being resumed was written by {world} training processes, this run "
            f"has {now['world_size']}. A resume keeps the world size: the global batch "
            "(processes x batch_size x accumulate_grad_batches), the LR schedule's step count and "
            f"the data order all depend on it. Relaunch with {world} processes (nnodes x "
            "nproc_per_node) or resume from a checkpoint at an epoch's end, or delete the "
            "checkpoint folder (checkpoint_dir) to start this training over."
        )
    was = saved.get("batch_size")
    if was is not None and "batch_size" in now and was != now["batch_size"]:
        raise LayoutChanged(
            f"the checkpoint being resumed was written with {was} samples per device and "
            f"step, this run has {now['batch_size']} (a GPU sizes its batch from its memory: "
            "device_settings.py): the data order and the LR schedule depend on it. "
            f"Set batch_size {was} and gpu_batch_tokens 0 to resume here, or "
            "delete the checkpoint folder (checkpoint_dir) to start this training over."
        )
    changed = [
        k
        for k in ("num_nodes", "num_canonical_nodes")
        if k in saved and k in now and saved[k] != now[k]
    ]
    if changed:
        ranks = int(world) // int(saved["num_nodes"]) if world and saved.get("num_nodes") else "?"
        raise LayoutChanged(
            f"the checkpoint being resumed was written on {saved.get('num_nodes')} nodes x "
            f"{ranks} processes (data.num_canonical_nodes {saved.get('num_canonical_nodes')}), "
            f"this run has {now['num_nodes']} nodes x {now['world_size'] // now['num_nodes']} "
            f"processes (data.num_canonical_nodes {now.get('num_canonical_nodes')}): which "
            "samples each rank streams, and so which repeats are masked, depend on the node "
            f"layout. Relaunch with nnodes {saved.get('num_nodes')} x nproc_per_node {ranks}, or "
            "delete the checkpoint folder (checkpoint_dir) to start this training over."
        )
