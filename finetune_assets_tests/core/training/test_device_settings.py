"""GPU defaults chosen in one place (``core/training/device_settings.py``); CPU runs keep the
config.

The sizing is read off real configs (BERT-base's ``BertConfig`` defaults, saved as a model folder);
a device's memory is its datasheet number, since no GPU is here. SDPA and ``compile`` run for real:
transformers judges SDPA support (DeBERTa-v2 has none), inductor compiles the tiny BERT's blocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET
from finetune_assets.core.training import device_settings as ds
from finetune_assets.core.training.module import load_classifier
from finetune_assets.core.training.run import train
from finetune_assets_tests.core.training.fixtures import write_mds_splits
from finetune_assets_tests.core.training.test_train import trainer_config

GiB = 2**30


@pytest.fixture(scope="module")
def bert_base(tmp_path_factory) -> Path:
    """A model folder holding only BERT-base's config (what the sizing reads; no weights)."""
    from transformers import BertConfig

    out = tmp_path_factory.mktemp("bert-base")
    BertConfig().save_pretrained(out)  # 12 layers x 768, 30522 pieces: bert-base-uncased's shape
    return out


def _config(model_dir: Path, **overrides):
    from finetune_assets.core.training.config import TrainerConfig

    return TrainerConfig.from_dict(
        {
            "model_dir": str(model_dir),
            "output_dir": "/o",
            "checkpoint_dir": "/c",
            "data": {"train_url": "a", "validation_url": "b", "test_url": "c"},
            **overrides,
        }
    )


def test_a_gpu_sizes_its_batch_from_memory_and_the_encoder_and_a_cpu_keeps_the_config(bert_base):
    """BERT-base at max_length 512: 128 a device on an 80 GB H100 (and a 141 GB H200: capped),
    32 on a 24 GB L4; eval 4 x; workers from the CPUs per local rank. CPU: batch 8, workers 0.
    """
    shape = ds.EncoderShape.of(str(bert_base))
    assert (shape.hidden_size, shape.layers) == (768, 12)
    assert 105e6 < shape.parameters < 115e6  # bert-base: 110M
    config = _config(bert_base)

    h100, rec = ds.resolve(config, gpu=True, local_world=8, device_memory=80 * GiB, cpus=64)
    assert (h100.batch_size, h100.eval_batch_size, h100.num_workers) == (128, 512, 7)
    assert (rec.batch_from, rec.batch_tokens, rec.device) == ("auto", 65536, "cuda")
    h200, _ = ds.resolve(config, gpu=True, local_world=8, device_memory=141 * GiB, cpus=64)
    assert h200.batch_size == 128  # capped: MAX_BATCH_TOKENS
    l4, _ = ds.resolve(config, gpu=True, device_memory=24 * GiB, cpus=4)
    assert (l4.batch_size, l4.num_workers) == (32, 3)
    short, _ = ds.resolve(
        _config(bert_base, max_length=128), gpu=True, device_memory=80 * GiB, cpus=16
    )
    assert short.batch_size == 512  # the same token budget, shorter sequences

    cpu, rec = ds.resolve(config, gpu=False, cpus=64)
    assert (cpu.batch_size, cpu.eval_batch_size, cpu.num_workers) == (8, 8, 0)
    assert (rec.batch_from, rec.batch_tokens, rec.device) == ("batch_size", None, "cpu")

    # what a person sets wins: a token budget, the plain batch (0), eval batch and workers
    given, rec = ds.resolve(
        _config(bert_base, gpu_batch_tokens=8192, eval_batch_size=64, num_workers=2),
        gpu=True,
        device_memory=80 * GiB,
        cpus=64,
    )
    assert (given.batch_size, given.eval_batch_size, given.num_workers) == (16, 64, 2)
    assert rec.batch_from == "gpu_batch_tokens"
    plain, rec = ds.resolve(_config(bert_base, gpu_batch_tokens=0), gpu=True, cpus=64)
    assert (plain.batch_size, plain.eval_batch_size, rec.batch_from) == (8, 32, "batch_size")
    bigger, _ = ds.resolve(
        _config(bert_base, batch_size=256), gpu=True, device_memory=80 * GiB, cpus=64
    )
    assert bigger.batch_size == 256  # never below batch_size


def test_sharded_checkpoints_need_a_sharding_strategy(bert_base):
    from finetune_assets.core.training.config import ConfigError

    with pytest.raises(ConfigError, match="needs strategy 'fsdp'"):
        _config(bert_base, checkpoint_format="sharded")
    assert _config(bert_base, checkpoint_format="sharded", strategy="fsdp").checkpoint_format


def test_sdpa_where_the_class_supports_it_else_eager_with_the_reason(tmp_path, tiny_model_dir):
    from finetune_assets_tests.core.training.encoder_families import build_family

    def loader(folder):
        return lambda impl: load_classifier(str(folder), DEFAULT_LABEL_SET, impl)

    model, used, why = ds.load_with_attention(loader(tiny_model_dir), "auto")
    assert (used, why) == ("sdpa", None)
    _, used, why = ds.load_with_attention(loader(tiny_model_dir), "eager")
    assert (used, why) == ("eager", None)
    deberta = build_family("deberta-v2", tmp_path / "deberta", ["a tiny corpus", "of reviews"] * 20,
                           num_labels=3)  # fmt: skip
    model, used, why = ds.load_with_attention(loader(deberta), "sdpa")
    assert used == "eager" and "DebertaV2" in why, why
    assert type(model).__name__ == "DebertaV2ForSequenceClassification"


@pytest.mark.slow
def test_compile_trains_the_compiled_blocks_and_exports_the_same_model(
    tmp_path, tiny_model_dir, arabic_reviews
):
    """``compile: true`` on CPU (inductor's C++ backend, the real compiler): both encoder blocks
    compiled, the run records it and SDPA, and the exported weights are the eager run's within
    1e-4 in fp32 without dropout (fused kernels reorder float sums; a wrong graph would be off by
    far more). Slow (about a
    minute here on 2 shared cores): the compile itself is what is tested.
    """
    import json

    from safetensors.torch import load_file

    # dropout off: inductor draws its own masks (not eager's), which alone moves the weights apart
    config_file = tiny_model_dir / "config.json"
    cfg = json.loads(config_file.read_text())
    config_file.write_text(
        json.dumps({**cfg, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    )
    shards = write_mds_splits(
        tmp_path / "published", tiny_model_dir, arabic_reviews / "PROD.csv", sizes=(16, 4, 4)
    )
    settings = dict(batch_size=4, bucket_batches=1, lr=1e-3, class_weights="none", precision="32")
    eager = train(trainer_config(tmp_path / "eager", tiny_model_dir, shards, **settings))
    compiled = train(
        trainer_config(tmp_path / "compiled", tiny_model_dir, shards, compile=True, **settings)
    )
    assert eager["device_settings"]["compiled_blocks"] == 0
    assert compiled["device_settings"]["compiled_blocks"] == 2
    assert compiled["device_settings"]["attn_implementation"] == "sdpa"
    assert compiled["device_settings"]["num_workers"] == 0  # CPU: in-process
    a = load_file(tmp_path / "eager" / "out" / "model" / "model.safetensors")
    b = load_file(tmp_path / "compiled" / "out" / "model" / "model.safetensors")
    assert a.keys() == b.keys()  # compiled in place: no _orig_mod. prefix
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-4, msg=key)


def test_fused_adamw_only_where_lightning_lets_it_clip():
    """Lightning's mixed-precision plugin refuses to clip gradients for an optimizer that unscales
    inside its step: fused AdamW with clipping under AMP failed DDP on a GPU at its first step.
    """
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert ds.adamw_options(cuda) == {"fused": True}
    assert ds.adamw_options(cuda, clips_under_amp=True) == {}
    assert ds.adamw_options(cpu) == {}
