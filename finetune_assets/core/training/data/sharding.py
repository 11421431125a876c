"""``strategy: fsdp``: torch's FSDP2 (``fully_shard``) under Lightning's ``ModelParallelStrategy``.

Why not Lightning's ``FSDPStrategy`` (FSDP1): it refuses CPU ("FSDP needs a non-CPU accelerator
device"), so no CPU test could run a sharded step; and after ``fit`` a ``trainer.test()``
re-wraps the already-wrapped module into a root with no parameters of its own, leaving the
embeddings as flat views (``'weight' must be 2-D``; Lightning #20255, pytorch #111958). FSDP2
shards each parameter as a ``DTensor`` on a device mesh, runs on gloo (CPU) and NCCL alike, and
``configure_model`` shards once: the test, the export and a resume reuse the sharded module.

Layout: each encoder block is one FSDP unit, the root (embeddings, pooler, classifier) another.
On one node the parameters are sharded over its ranks; across nodes the mesh is (nodes x ranks
per node): replicated across nodes, sharded within a node (HSDP, FSDP1's ``HYBRID_SHARD``), so
all-gathers stay on the node's fast links and only gradient all-reduces cross nodes.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
from pytorch_lightning.strategies import ModelParallelStrategy
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from finetune_assets.core.io.primitives import rename_into_place
from finetune_assets.core.training.checkpoints import fencing


def encoder_layer_class(model: torch.nn.Module) -> type[torch.nn.Module]:
    """The encoder's repeated block class (``BertLayer``, ``XLMRobertaLayer``...): FSDP's unit.

    The class of the first list of two or more identical blocks (what every encoder keeps its
    layers in); sharding the whole model as one unit would gather everything at once, sharding only
    a sub-module of the block (some ``_no_split_modules`` name attention classes) would leave the
    feed-forward in the root unit.
    """
    for module in model.modules():
        if (
            isinstance(module, torch.nn.ModuleList)
            and len(module) > 1
            and len({type(m) for m in module}) == 1
        ):
            return type(module[0])
    raise ValueError(
        f"{type(model).__name__}: no repeated encoder block found to shard for FSDP; "
        "use strategy 'ddp'"
    )


def fsdp_mesh(mesh: Any) -> Any:
    """The mesh to shard on, from the strategy's (nodes x ranks per node) mesh: 1-D on one node,
    else both dimensions (HSDP).
    """
    if mesh.size(0) == 1:
        return mesh[mesh.mesh_dim_names[1]]
    return mesh


def mixed_precision(precision: str) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for a Lightning precision, None for full fp32.

    Under ``bf16-mixed`` the all-gathered parameters (and so the compute) are bf16 and gradients
    are reduce-scattered in fp32: half the all-gather bytes, no bf16 rounding in the gradient sum.
    The sharded parameters the optimizer updates stay fp32 (the master weights).
    """
    if precision != "bf16-mixed":
        return None

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_encoder(model: torch.nn.Module, mesh: Any, mp_policy: Any = None) -> bool:
    """``fully_shard`` each encoder block, then the model as root; False when it is already sharded.

    Lightning calls ``configure_model`` before every ``fit``/``validate``/``test``: sharding twice
    would be the FSDP1 re-wrap bug again, so a sharded model is left as it is.
    """
    if isinstance(model, FSDPModule):
        return False
    policy = {"mp_policy": mp_policy or MixedPrecisionPolicy()}
    block = encoder_layer_class(model)
    for module in list(model.modules()):
        if isinstance(module, block):
            fully_shard(module, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)
    return True


def set_gradient_sync(model: torch.nn.Module, sync: bool) -> bool:
    """Under FSDP2: reduce-scatter gradients only on an accumulation window's last micro-batch.

    Lightning's ``block_backward_sync`` skips the all-reduce inside accumulation for DDP only; an
    FSDP2 module would reduce-scatter on every micro-batch. False when the model is not sharded.
    """
    if not isinstance(model, FSDPModule):
        return False
    model.set_requires_gradient_sync(sync)
    return True


class ShardedStrategy(ModelParallelStrategy):
    """FSDP2 with full (rank 0) checkpoints written through the checkpoint IO, path as given; or,
    with ``checkpoint_format: sharded``, DCP folders every rank writes its own shards into.

    Full (the default): ``last.ckpt`` stays one file that DDP and FSDP runs, the export and resume
    all read the same way. Lightning's ``save_checkpoint`` makes the path a ``pathlib.Path`` first
    (``s3://b/x`` becomes ``s3:/b/x``); here rank 0 hands it to the checkpoint IO unchanged.
    Loading reads a local copy (``checkpoints.resume.local_resume``).

    Sharded (:func:`save_sharded`): no rank ever holds the whole state (a model beyond ~1B
    parameters whose gathered state would not fit one host), written in parallel.
    """

    def __init__(
        self, num_nodes: int, ranks_per_node: int, sharded_checkpoints: bool = False, **kwargs: Any
    ):
        super().__init__(
            data_parallel_size=num_nodes,
            tensor_parallel_size=ranks_per_node,
            save_distributed_checkpoint=sharded_checkpoints,
            **kwargs,
        )
        self.sharded_checkpoints = sharded_checkpoints

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None
    ) -> None:
        if self.sharded_checkpoints:
            io = getattr(self.checkpoint_io, "checkpoint_io", None) or self.checkpoint_io
            save_sharded(self, checkpoint, str(filepath), getattr(io, "fence_dir", None))
        elif self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint, str(filepath), storage_options)

    def full_state_dict(self) -> dict[str, Any]:
        """The gathered model state on rank 0 (empty elsewhere), whatever the checkpoint format:
        what the Hugging Face export needs (a collective: every rank calls it).
        """
        # lazy, as every torch.distributed.checkpoint import here: only FSDP runs use DCP, and
        # Lightning does not load it
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)


# -- sharded (DCP) checkpoints ---------------------------------------------------------------------

META = "meta.pt"  # Lightning's name (lightning_fabric.strategies.fsdp._METADATA_FILENAME)


def is_sharded_checkpoint(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, META))


def save_sharded(
    strategy: Any, checkpoint: dict[str, Any], filepath: str, fence_dir: str | None = None
) -> None:
    """Write ``checkpoint`` as a DCP folder at ``filepath``, atomically: all ranks write their
    shards into ``<path>.partial``, rank 0 adds ``meta.pt`` (loops, callbacks, schedulers:
    Lightning's layout, so its loader reads it) and swaps the folder in for the previous one.

    DCP overwrites its files in place; a crash half-way through re-saving ``last.ckpt`` would leave
    old and new shards mixed. The swap is two renames (previous -> ``<path>.old``, new -> path);
    a crash between them leaves ``.old``, which :func:`recover_swap` puts back at the next start.
    Local (or shared-volume) paths only: ``checkpoint_format`` refuses an object-store URL.
    ``fence_dir``: as the full format's commit (``files.AtomicCheckpointIO``), the swap is refused
    once a newer gang fenced the run's checkpoint folder.
    """
    import torch.distributed.checkpoint as dcp  # lazy: see ShardedStrategy.full_state_dict

    path = strategy.broadcast(filepath)
    staging, old = path + ".partial", path + ".old"
    if strategy.is_global_zero:
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
    strategy.barrier("dcp-staging")
    state = {"state_dict": checkpoint.pop("state_dict")}
    for i, optimizer in enumerate(checkpoint.pop("optimizer_states", [])):
        state[f"optimizer_{i}"] = optimizer
    dcp.save(state, checkpoint_id=staging)  # each rank its shards; rank 0 the .metadata, last
    if strategy.is_global_zero:
        torch.save(checkpoint, os.path.join(staging, META))
        if fence_dir is not None:
            fencing.check_fence(fence_dir)  # just before the swap
        if os.path.lexists(path):
            shutil.rmtree(old, ignore_errors=True)
            rename_into_place(path, old)
        rename_into_place(staging, path)
        if os.path.isdir(old):
            shutil.rmtree(old, ignore_errors=True)
        elif os.path.lexists(old):
            os.remove(old)
    strategy.barrier("dcp-saved")


def recover_swap(path: str) -> bool:
    """Put ``<path>.old`` back when a crash fell between :func:`save_sharded`'s two renames."""
    old = path + ".old"
    if os.path.lexists(path) or not os.path.lexists(old):
        return False
    rename_into_place(old, path)
    return True


def load_sharded_weights(module: torch.nn.Module, path: str) -> int:
    """Load only the model's weights from a DCP folder into the (sharded) ``module``, resharding
    to this run's mesh whatever world size wrote it; the ``global_step`` it was saved at.

    Not Lightning's ``load_checkpoint``: that also loads the optimizer (the best checkpoint's
    weights go into the module; the optimizer keeps training's state).
    """
    import torch.distributed.checkpoint as dcp  # lazy: see ShardedStrategy.full_state_dict
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    reshard(module)
    state = {"state_dict": get_model_state_dict(module)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(module, state["state_dict"])
    meta = torch.load(os.path.join(path, META), map_location="cpu", weights_only=True)
    return int(meta.get("global_step", -1))


def reshard(module: torch.nn.Module) -> None:
    """Return every FSDP unit to its sharded parameters (a no-op for an unsharded model).

    The FSDP root keeps its parameters gathered after a forward (they are needed again at once), as
    plain tensors: loading a full state dict into it then copies tensors into a mix of gathered and
    sharded (``DTensor``) parameters ("got mixed torch.Tensor and DTensor").
    """
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def local_parameters(module: torch.nn.Module) -> int:
    """Parameter elements this rank holds: a sharded parameter (``DTensor``) counts its local shard.

    Resharded first (``reshard``), so the count is what a rank holds between steps.
    """
    reshard(module)
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in module.parameters())
