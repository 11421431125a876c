from __future__ import annotations

import json

import pytest

from finetune_assets.training.config import ConfigError, TrainerConfig


def _cfg(**overrides):
    cfg = {
        "model_dir": "/m",
        "output_dir": "/o",
        "checkpoint_dir": "/c",
        "data": {"train_url": "/d/train", "validation_url": "/d/validation", "test_url": "/d/test"},
    }
    cfg.update(overrides)
    return cfg


def test_defaults_fine_tune_with_adamw_and_keep_the_seeds_epochs_and_batch(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_cfg()))
    c = TrainerConfig.from_json(str(path))
    assert (c.optim.name, c.optim.lr, c.optim.warmup_ratio, c.epochs, c.data.batch_size) == ("adamw", 5e-5, 0.1, 2, 8)
    assert c.class_weights == "balanced" and c.data.num_workers == 0
    seed = TrainerConfig.from_dict(_cfg(optim={"name": "adadelta", "lr": 1.0, "warmup_ratio": 0.0}))
    assert (seed.optim.name, seed.optim.lr, seed.optim.gamma) == ("adadelta", 1.0, 0.7)  # the seed's recipe
    assert TrainerConfig.from_dict(json.loads(c.to_json())) == c  # round trip


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        (_cfg(epoch=3), "unknown key 'epoch'"),
        (_cfg(data={"train_url": "a", "validation_url": "b", "test_url": "c", "batchsize": 4}), "unknown key 'data.batchsize'"),
        (_cfg(optim={"nmae": "adamw"}), "unknown key 'optim.nmae'"),
        ({"model_dir": "/m", "output_dir": "/o", "checkpoint_dir": "/c"}, "missing required key 'data'"),
    ],
)
def test_rejects_unknown_and_missing_keys(cfg, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        TrainerConfig.from_dict(cfg)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"epochs": 0}, "epochs must be >= 1"),
        ({"epochs": "2"}, "epochs: expected an integer"),
        ({"precision": "8-bit"}, "precision: '8-bit' is not one of"),
        ({"strategy": "deepspeed"}, "strategy"),
        ({"optim": {"name": "sgd"}}, "optim.name"),
        ({"optim": {"lr": -1}}, "optim.lr must be > 0"),
        ({"gradient_clip_val": 0}, "gradient_clip_val must be > 0"),
        ({"max_steps": 0}, "max_steps"),
        ({"accelerator": "cpu", "precision": "16-mixed"}, "needs a GPU"),
        ({"mlflow": {"tags": {"api_token": "x"}}}, "looks like a secret"),
        ({"mlflow": {"tags": {"dataset_version": 3}}}, "strings to strings"),
        ({"data": {"train_url": "s3://b/train", "validation_url": "/v", "test_url": "/t",
                   "local_cache_dir": "s3://b/cache"}}, "local_cache_dir must be a local folder"),
        ({"class_weights": "inverse"}, "class_weights: 'inverse' is not one of"),
        ({"data": {"train_url": "/a", "validation_url": "/v", "test_url": "/t", "batch_size": 0}}, "data.batch_size must be >= 1"),
    ],
)
def test_rejects_bad_values(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        TrainerConfig.from_dict(_cfg(**overrides))


def test_precision_accepts_int_and_hparams_hide_paths():
    c = TrainerConfig.from_dict(_cfg(precision=32, mlflow={"tags": {"dataset_version": "v1"}}))
    assert c.precision == "32"
    params = c.hparams()
    assert params["optim.lr"] == 5e-5 and params["data.batch_size"] == 8
    assert not any("url" in k or "dir" in k or k.startswith("mlflow") for k in params)
