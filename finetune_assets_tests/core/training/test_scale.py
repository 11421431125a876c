"""What a multi-node GPU run depends on, checked on CPU without a process group or a GPU.

Evaluation blocks per rank, class weights from the shards' metadata, the cache sized per node,
canonical nodes, the process-group attempt token, the FSDP pieces that run before any collective
(wrap unit, decay groups by name, fp32 gradient reduction, object-store checkpoint paths), and the
refusal of a resume on another world size.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import fsspec
import pytest
import torch

from finetune_assets.core.io.contracts import ContractError, read_split_stats
from finetune_assets.core.training.checkpoints.layout import WorldSizeChanged
from finetune_assets.core.training.checkpoints.trainer_files import AtomicCheckpointIO
from finetune_assets.core.training.config import ConfigError, DataConfig, TrainerConfig
from finetune_assets.core.training.data.collate import PAD_LABEL
from finetune_assets.core.training.data.datamodule import RankBlock, canonical_nodes
from finetune_assets.core.training.data.shard_cache import (
    cache_limit_bytes,
    clean_stale_streaming_memory,
    read_index,
)
from finetune_assets.core.training.data.sharding import ShardedStrategy
from finetune_assets.core.training.hyperparameters import HyperParameters
from finetune_assets.core.training.module import ReviewClassifier, load_classifier
from finetune_assets.core.training.optimization import decays
from finetune_assets.core.training.process_group import ATTEMPT_KEYS, agree_on_attempt
from finetune_assets.core.training.run import _strategy
from finetune_assets_tests.core.training.fixtures import write_split

N = 37  # prime: uneven over any world size


@pytest.fixture
def split(tmp_path: Path) -> Path:
    ids = [[101, 1000 + i, 2000 + (i % 7), 102] for i in range(N)]
    return write_split(tmp_path / "test", ids, [i % 3 for i in range(N)], size_limit=1 << 8)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 40])
def test_eval_blocks_read_every_sample_exactly_once_with_equal_lengths(
    open_dataset, split, tmp_path, world
):
    clean_stale_streaming_memory()
    ds = open_dataset(remote=str(split), local=str(tmp_path / f"cache{world}"), batch_size=1)
    blocks = [RankBlock(ds, rank, world) for rank in range(world)]
    # every rank runs as many steps (FSDP gathers per forward)
    assert len({len(b) for b in blocks}) == 1
    real, pads = [], 0
    for block in blocks:
        for i in range(len(block)):
            sample = block[i]
            if int(sample["label"]) == PAD_LABEL:
                pads += 1
            else:
                real.append(int(sample["input_ids"][1]) - 1000)
    assert sorted(real) == list(range(N))  # each sample once, none padded in twice
    assert pads == world * len(blocks[0]) - N
    starts = [b.start for b in blocks]
    assert starts == sorted(starts)  # contiguous blocks: a node reads its own share of the shards


def test_train_label_counts_come_from_split_stats_never_from_decoding(split):
    assert read_split_stats(str(split)).counts(3) == [13, 12, 12]
    with pytest.raises(ContractError, match=r"split_stats.json: label 2 outside 0..1"):
        read_split_stats(str(split)).counts(2, where=str(split / "split_stats.json"))
    (
        split / "split_stats.json"
    ).unlink()  # shards written before the stats file existed: no silent decoding
    with pytest.raises(ContractError, match="re-materialize mds_shards"):
        read_split_stats(str(split))


def test_balanced_class_weights_need_the_counts_the_config_carries():
    data = DataConfig(train_url="/t", validation_url="/v", test_url="/e")
    config = TrainerConfig(model_dir="/m", output_dir="/o", checkpoint_dir="/c", data=data)
    with pytest.raises(ConfigError, match="train_label_counts"):
        config.train_label_counts()
    data.train_label_counts = [3, 2]  # one count short of the three labels
    with pytest.raises(ConfigError, match="one count per label"):
        config.train_label_counts()
    data.train_label_counts = [3, 2, 1]
    assert config.train_label_counts() == [3, 2, 1]


def test_cache_limit_is_a_node_share_of_the_split_and_canonical_nodes_cover_the_nodes(split):
    index = read_index(str(split), "test")
    sizes = [
        s["raw_data"]["bytes"] + (s.get("zip_data") or {}).get("bytes", 0) for s in index["shards"]
    ]
    assert len(sizes) > 4
    one, two = cache_limit_bytes(index, 1), cache_limit_bytes(index, 2)
    assert one >= sum(sizes) and two < one and two >= sum(sizes) / 2 + 4 * max(sizes)
    assert cache_limit_bytes({"shards": []}, 2) == 0
    data = DataConfig(train_url="/t", validation_url="/v", test_url="/e")
    assert canonical_nodes(data, 1) == 1 and canonical_nodes(data, 4) == 4
    assert (
        canonical_nodes(
            DataConfig(train_url="/t", validation_url="/v", test_url="/e", num_canonical_nodes=8), 2
        )
        == 8
    )
    for bad in (1, 3):
        with pytest.raises(ValueError, match="multiple of the node count"):
            canonical_nodes(
                DataConfig(
                    train_url="/t", validation_url="/v", test_url="/e", num_canonical_nodes=bad
                ),
                2,
            )


def _store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _start_group(store, world: int, restart_counts: list[int]) -> list[str]:
    """Every rank in its own thread, started in a random order and at random moments."""
    import torch.distributed as dist

    tokens: list[str | None] = [None] * world
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            time.sleep(random.uniform(0, 0.1))
            client = dist.TCPStore("127.0.0.1", store.port, is_master=False)
            # what used to name the prefix, different per node after one node's workers restarted
            assert restart_counts[r] >= 0
            tokens[r] = agree_on_attempt(client, r, world, timeout=20, poll=0.005)
        except BaseException as err:  # noqa: BLE001 - re-raised in the test thread
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in random.sample(range(world), world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return tokens  # type: ignore[return-value]


def test_every_rank_agrees_on_a_fresh_attempt_token_despite_stale_keys_and_unequal_restart_counts():
    store = _store()
    first = _start_group(store, 4, [0, 0, 0, 0])
    assert len(set(first)) == 1
    # a previous start's leftovers: asks that were never answered, answers and acks of old tokens
    store.set(f"{ATTEMPT_KEYS}/ask/2", "stale-nonce")
    store.set(f"{ATTEMPT_KEYS}/answer/stale-nonce", "old-token")
    store.set(f"{ATTEMPT_KEYS}/ack/old-token/1", "1")
    # node 0's agent restarted its workers, node 1's did not
    second = _start_group(store, 4, [1, 1, 0, 0])
    assert len(set(second)) == 1 and second[0] not in (first[0], "old-token")


def test_attempt_token_times_out_naming_the_missing_ranks():
    with pytest.raises(TimeoutError, match=r"ranks \[1\] did not join"):
        agree_on_attempt(_store(), 0, 2, timeout=0.2, poll=0.01)


def test_decay_groups_by_name_survive_flat_parameters(tiny_model_dir):
    assert decays("model.bert.encoder.layer.0.attention.self.query.weight")
    assert decays("_fsdp_wrapped_module.model.bert.embeddings.word_embeddings.weight")
    for name in (
        "model.bert.encoder.layer.0.output.LayerNorm.weight",
        "model.classifier.bias",
        "model.layers.0.attn_norm.weight",
        "model.transformer.layer.0.sa_layer_norm.weight",
    ):
        assert not decays(name), name
    module = ReviewClassifier(
        load_classifier(str(tiny_model_dir)), HyperParameters(weight_decay=0.01)
    )
    module._trainer = SimpleNamespace(
        datamodule=None, estimated_stepping_batches=10, gradient_clip_val=1.0, precision="32-true"
    )
    # the weights to decay, seen before flattening
    matrices = sum(1 for p in module.parameters() if p.ndim >= 2)
    with torch.no_grad():  # what FSDP with use_orig_params shows: 1-D flat views of every weight
        for p in module.parameters():
            p.data = p.data.flatten()
    groups = module.configure_optimizers()["optimizer"].param_groups
    assert groups[0]["weight_decay"] == 0.01 and len(groups[0]["params"]) == matrices > 0
    assert groups[1]["weight_decay"] == 0.0 and len(groups[1]["params"]) > 0


def test_fsdp_is_fsdp2_replicated_across_nodes_and_sharded_within_one():
    config = TrainerConfig(
        model_dir="/m",
        output_dir="/o",
        checkpoint_dir="/c",
        strategy="fsdp",
        precision="bf16-mixed",
        gradient_clip_val=1.0,
        data=DataConfig(train_url="/t", validation_url="/v", test_url="/e"),
    )
    strategy = _strategy(config, world=8, local_world=4)
    assert isinstance(strategy, ShardedStrategy)
    # (nodes, ranks per node)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (
        2,
        4,
    )
    assert strategy._save_distributed_checkpoint is False  # one last.ckpt, as under DDP
    auto = config.model_copy(update={"strategy": "auto"})
    # BERT-base: a replica fits
    assert _strategy(auto, world=8, local_world=4, parameters=110_000_000) == "ddp"
    assert isinstance(
        _strategy(auto, world=8, local_world=4, parameters=3_000_000_000), ShardedStrategy
    )
    # one process: no wrapper
    assert _strategy(auto, world=1, local_world=1, parameters=3_000_000_000) == "auto"
    with pytest.raises(
        ConfigError, match="'16-mixed' is not supported with strategy 'fsdp'; use 'bf16-mixed'"
    ):
        TrainerConfig.from_dict({**config.to_dict(), "precision": "16-mixed", "accelerator": "gpu"})


def test_checkpoints_keep_object_store_urls(tmp_path):
    """``memory://`` stands in for ``s3://``: an fsspec URL that a ``pathlib.Path`` would mangle."""
    strategy = ShardedStrategy(num_nodes=1, ranks_per_node=1)
    strategy.checkpoint_io = AtomicCheckpointIO()
    strategy.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, "memory://bucket/run/last.ckpt")
    fs = fsspec.filesystem("memory")
    assert fs.exists("/bucket/run/last.ckpt")
    with fs.open("/bucket/run/last.ckpt", "rb") as f:
        assert torch.equal(torch.load(f, weights_only=True)["state_dict"]["w"], torch.ones(2))
    AtomicCheckpointIO().save_checkpoint({"a": torch.zeros(1)}, tmp_path / "x" / "last.ckpt")
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["last.ckpt"]  # no temp file left behind


def test_resume_on_another_world_size_is_refused_clearly(tiny_model_dir):
    module = ReviewClassifier(load_classifier(str(tiny_model_dir)), HyperParameters())
    module._trainer = SimpleNamespace(world_size=1)
    # same: fine
    module.on_load_checkpoint({"review_classifier": {"world_size": 1, "samples_seen": 8}})
    # written before it was recorded
    module.on_load_checkpoint({"review_classifier": {"samples_seen": 8}})
    with pytest.raises(
        WorldSizeChanged, match=r"written by 2 training processes, this run has 1.*Relaunch with 2"
    ):
        module.on_load_checkpoint({"review_classifier": {"world_size": 2}})


def test_fp32_class_weighted_loss_under_bf16_logits(tiny_model_dir):
    weights = [0.3333, 1.6667, 3.1234]
    module = ReviewClassifier(
        load_classifier(str(tiny_model_dir)), HyperParameters(), class_weights=weights
    )
    logits = torch.randn(6, 3).to(torch.bfloat16)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    loss = module.train_loss(logits, labels)
    expected = torch.nn.functional.cross_entropy(
        logits.float(), labels, weight=torch.tensor(weights)
    )
    assert loss.dtype == torch.float32 and torch.allclose(loss, expected)
    assert module.class_weight.dtype == torch.float32


@pytest.mark.parametrize(
    ("world", "bucket", "stop_after", "workers"),
    [
        (2, 1, None, 0),
        (3, 1, None, 0),
        (3, 2, None, 0),
        (3, 1, 2, 0),
        (2, 2, 3, 0),
        (3, 1, None, 2),
    ],
)
def test_training_counts_each_sample_once_though_streaming_repeats_some(
    open_dataset, split, tmp_path, monkeypatch, world, bucket, stop_after, workers
):
    """Each rank as its own node, one after the other (streaming reads the world from the
    environment).

    streaming would join a process group to share its shared-memory prefix; each node here is one
    process with its own prefix, so that step is skipped.
    """
    monkeypatch.setattr("streaming.base.dataset.maybe_init_dist", lambda: False)
    from finetune_assets.core.training.data.collate import DynamicPaddingCollator
    from finetune_assets.core.training.data.streaming_loader import (
        ResumableStreamingDataLoader,
        repeated_positions,
    )

    counted, streamed = [], []
    for rank in range(world):
        clean_stale_streaming_memory()
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        monkeypatch.setenv("LOCAL_RANK", "0")

        def loader(attempt: int, rank: int = rank) -> ResumableStreamingDataLoader:
            clean_stale_streaming_memory()
            ds = open_dataset(
                remote=str(split),
                local=str(tmp_path / f"c{rank}-{attempt}"),
                batch_size=4 * bucket,
                shuffle=True,
                shuffle_seed=3,
                num_canonical_nodes=world,
            )
            repeated = repeated_positions(N, world, world, 1, rank, 4 * bucket, ds.partition_algo)
            return ResumableStreamingDataLoader(
                ds,
                batch_size=4,
                collate_fn=DynamicPaddingCollator(),
                epoch_fn=lambda: 0,
                world_size=world,
                bucket_batches=bucket,
                repeated=repeated,
                num_nodes=world,
                num_workers=workers,
            )

        n, first = 0, loader(0)
        batches = iter(first)
        # consume some batches, then resume from the loader's state in a fresh loader
        if stop_after:
            for _ in range(stop_after):
                batch = next(batches)
                first.mark_consumed(len(batch["labels"]))
                keep = batch["labels"] != PAD_LABEL
                counted += (batch["input_ids"][:, 1] - 1000)[keep].tolist()
                n += len(keep)
            state = first.state_dict()
            del batches, first
            first = loader(1)
            first.load_state_dict(state)
            batches = iter(first)
        for batch in batches:
            keep = batch["labels"] != PAD_LABEL
            counted += (batch["input_ids"][:, 1] - 1000)[keep].tolist()
            assert batch["num_samples"] == int(keep.sum())
            n += len(keep)
        streamed.append(n)
        del batches, first
    # streaming padded every rank to the same length
    assert len(set(streamed)) == 1 and sum(streamed) > N
    # yet each sample is trained (and counted) exactly once
    assert sorted(counted) == list(range(N))


def test_mlflow_logging_wait_is_bounded():
    from finetune_assets.core.training.export import within as _within

    assert _within(5, "x", lambda: 7) == 7
    with pytest.raises(
        TimeoutError, match=r"MLflow logging did not finish within 0s \(mlflow.timeout_seconds\)"
    ):
        _within(0.2, "MLflow logging", lambda: time.sleep(5))
    with pytest.raises(KeyError):
        _within(5, "x", lambda: {}["missing"])


@pytest.mark.parametrize("family", ["distilbert", "xlm-roberta", "deberta-v2"])
def test_fsdp_wrap_unit_is_the_whole_encoder_block_of_each_family(family):
    import transformers as t

    small = dict(
        num_hidden_layers=2,
        num_attention_heads=2,
        hidden_size=32,
        intermediate_size=64,
        vocab_size=100,
    )
    model, block = {
        "distilbert": (
            lambda: t.DistilBertForSequenceClassification(
                t.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=100)
            ),
            "TransformerBlock",
        ),
        "xlm-roberta": (
            lambda: t.XLMRobertaForSequenceClassification(t.XLMRobertaConfig(**small)),
            "XLMRobertaLayer",
        ),
        "deberta-v2": (
            lambda: t.DebertaV2ForSequenceClassification(t.DebertaV2Config(**small)),
            "DebertaV2Layer",
        ),
    }[family]
    from finetune_assets.core.training.data.sharding import encoder_layer_class

    assert encoder_layer_class(model()).__name__ == block


def test_resume_on_another_node_layout_with_the_same_world_size_is_refused(tiny_model_dir):
    """2 nodes x 1 process -> 1 node x 2: the world size matches, the streamed partition does
    not.
    """
    from finetune_assets.core.training.checkpoints.layout import LayoutChanged

    module = ReviewClassifier(load_classifier(str(tiny_model_dir)), HyperParameters())
    data = DataConfig(train_url="/t", validation_url="/v", test_url="/e")
    two_nodes = SimpleNamespace(
        world_size=2,
        num_nodes=2,
        datamodule=SimpleNamespace(config=SimpleNamespace(data=data, batch_size=8)),
    )
    module._trainer = two_nodes
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["review_classifier"] == {
        "world_size": 2,
        "num_nodes": 2,
        "num_canonical_nodes": 2,
        "batch_size": 8,
        "nonfinite_skipped": 0,
    }
    module.on_load_checkpoint(checkpoint)  # the same layout resumes
    module._trainer = SimpleNamespace(**{**vars(two_nodes), "num_nodes": 1})
    with pytest.raises(
        LayoutChanged,
        match=r"written on 2 nodes x 1 processes .* this run has 1 nodes x 2 "
        r"processes.*Relaunch with nnodes 2 x nproc_per_node 1",
    ):
        module.on_load_checkpoint(checkpoint)


def test_fsdp_shards_within_a_node_and_replicates_across_nodes():
    """The strategy's (nodes x ranks per node) mesh: 1-D over the ranks on one node, HSDP's 2-D
    mesh across nodes.
    """
    from finetune_assets.core.training.data.sharding import fsdp_mesh

    class Mesh:  # a DeviceMesh's shape and names, which is all fsdp_mesh reads
        def __init__(self, shape):
            self.shape, self.mesh_dim_names = shape, ("data_parallel", "tensor_parallel")

        def size(self, dim):
            return self.shape[dim]

        def __getitem__(self, name):
            return ("1-D", name, self.shape[self.mesh_dim_names.index(name)])

    # one node: shard over its 8 ranks
    assert fsdp_mesh(Mesh((1, 8))) == (
        "1-D",
        "tensor_parallel",
        8,
    )
    two_nodes = Mesh((2, 8))
    assert fsdp_mesh(two_nodes) is two_nodes  # replicate across the 2 nodes, shard within each
