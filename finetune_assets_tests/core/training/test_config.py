"""The trainer file: defaults, validation of every field, and the hyper-parameters written once."""

from __future__ import annotations

import json

import pytest

from finetune_assets.core.training.config import ConfigError, TrainerConfig
from finetune_assets.core.training.hyperparameters import HyperParameters


def _cfg(**overrides):
    cfg = {
        "model_dir": "/m",
        "output_dir": "/o",
        "checkpoint_dir": "/c",
        "data": {"train_url": "/d/train", "validation_url": "/d/validation", "test_url": "/d/test"},
    }
    cfg.update(overrides)
    return cfg


def test_defaults_fine_tune_with_adamw_bucketing_and_auto_precision(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_cfg()))
    c = TrainerConfig.from_json(str(path))
    # two epochs, the best validation kept: benchmarks/README.md, "Recipe study"
    assert (c.optimizer, c.lr, c.warmup_ratio, c.lr_schedule, c.epochs, c.batch_size) == (
        "adamw",
        5e-5,
        0.1,
        "linear",
        2,
        8,
    )
    assert (c.select_model, c.early_stopping_patience, c.val_check_every_n_steps) == (
        "best",
        2,
        None,
    )
    # unset: 0 on CPU, from the CPU count on a GPU (core/training/device_settings.py)
    assert c.class_weights == "balanced" and c.num_workers is None
    assert (c.compile, c.attn_implementation, c.checkpoint_format) == (False, "auto", "full")
    # the measured fast defaults (benchmarks/defaults.py)
    assert (c.precision, c.bucket_batches) == (
        "auto",
        16,
    )
    seed = TrainerConfig.from_dict(_cfg(optimizer="adadelta", lr=1.0, warmup_ratio=0.0))
    assert (seed.optimizer, seed.lr, seed.gamma) == ("adadelta", 1.0, 0.7)  # the seed's recipe
    assert TrainerConfig.from_dict(json.loads(c.to_json())) == c  # round trip


def test_the_trainer_and_the_launchpad_share_one_set_of_defaults():
    """The Dagster config adds only the run name and where the hyper-parameters come from: every
    trainer hyper-parameter, with its default, is the same field.
    """
    from finetune_assets.defs.models.finetuned import FinetuneConfig

    launchpad = {
        k: f
        for k, f in FinetuneConfig.model_fields.items()
        if k not in ("run_name", "hyper_parameters_from")
    }
    assert launchpad.keys() == HyperParameters.model_fields.keys()
    for name, field in HyperParameters.model_fields.items():
        assert (
            launchpad[name].default == field.default and launchpad[name].metadata == field.metadata
        ), name
    trainer = TrainerConfig.from_dict(_cfg(**FinetuneConfig(lr=1e-4).hyper_parameters()))
    assert trainer.hyper_parameters() == {**HyperParameters().hyper_parameters(), "lr": 1e-4}


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        (_cfg(epoch=3), "unknown key 'epoch'"),
        (
            _cfg(data={"train_url": "a", "validation_url": "b", "test_url": "c", "batchsize": 4}),
            "unknown key 'data.batchsize'",
        ),
        # the old nested shape is refused, not ignored
        (
            _cfg(optim={"name": "adamw"}),
            "unknown key 'optim'",
        ),
        (
            {"model_dir": "/m", "output_dir": "/o", "checkpoint_dir": "/c"},
            "missing required key 'data'",
        ),
    ],
)
def test_rejects_unknown_and_missing_keys(cfg, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        TrainerConfig.from_dict(cfg)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"epochs": 0}, "epochs: Input should be greater than or equal to 1"),
        ({"epochs": "2"}, "epochs: Input should be a valid integer"),
        ({"precision": "8-bit"}, "precision: Input should be 'auto', '32'"),
        ({"strategy": "deepspeed"}, "strategy"),
        ({"optimizer": "sgd"}, "optimizer: Input should be 'adamw' or 'adadelta'"),
        ({"lr": -1}, "lr: Input should be greater than 0"),
        ({"gradient_clip_val": 0}, "gradient_clip_val: Input should be greater than 0"),
        ({"max_steps": -2}, "max_steps"),
        ({"warmup_ratio": 1.0}, "warmup_ratio: Input should be less than 1"),
        ({"batch_size": 0}, "batch_size: Input should be greater than or equal to 1"),
        ({"bucket_batches": 0}, "bucket_batches"),
        ({"accelerator": "cpu", "precision": "16-mixed"}, "needs a GPU"),
        (
            {"mlflow": {"tags": {"api_token": "x"}}},
            "mlflow.tags: tag 'api_token' looks like a secret",
        ),
        (
            {"mlflow": {"tags": {"dataset_version": 3}}},
            "mlflow.tags.dataset_version: Input should be a valid string",
        ),
        (
            {
                "data": {
                    "train_url": "s3://b/train",
                    "validation_url": "/v",
                    "test_url": "/t",
                    "local_cache_dir": "s3://b/cache",
                }
            },
            "data.local_cache_dir: must be a local folder",
        ),
        ({"class_weights": "inverse"}, "class_weights: Input should be 'balanced' or 'none'"),
        ({"labels": ["A", "a"]}, "labels: must be at least two distinct class names"),
    ],
)
def test_rejects_bad_values_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        TrainerConfig.from_dict(_cfg(**overrides))


def test_precision_accepts_int_and_hparams_hide_paths():
    c = TrainerConfig.from_dict(_cfg(precision=32, mlflow={"tags": {"dataset_version": "v1"}}))
    assert c.precision == "32"
    params = c.hparams()
    assert (
        params["lr"] == 5e-5 and params["batch_size"] == 8 and params["data.shuffle_seed"] == 9176
    )
    assert not any("url" in k or "dir" in k or k.startswith("mlflow") for k in params)


def test_auto_precision_is_bf16_only_where_the_hardware_has_it(monkeypatch):
    import torch

    from finetune_assets.core.training import precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: True)
    assert precision.resolve_precision("auto", "auto") == "bf16-mixed"
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: False)
    assert precision.resolve_precision("auto", "cpu") == "32-true"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)  # e.g. a V100 / T4
    assert precision.resolve_precision("auto", "gpu") == "32-true"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert precision.resolve_precision("auto", "auto") == "bf16-mixed"
    assert precision.resolve_precision("auto", "cpu") == "32-true"  # cpu forced: the CPU decides
    assert precision.resolve_precision("32", "gpu") == "32-true"  # explicit choices pass through
    assert precision.resolve_precision("16-mixed", "gpu") == "16-mixed"


@pytest.mark.parametrize(
    ("config", "needle"),
    [({"epochs": 0}, "epochs"), ({"precision": "8-bit"}, "precision"), ({"lr": -1.0}, "lr")],
)
def test_the_launchpad_refuses_what_the_trainer_would_refuse_before_anything_runs(
    config, needle, tmp_path
):
    """Choices are checked by Dagster's schema, bounds by the same pydantic model when the step
    starts, before any input is read or a launcher called (the launcher here would fail the test if
    reached).
    """
    import dagster as dg

    from finetune_assets.defs.models.finetuned import finetuned_model
    from finetune_assets.defs.resources.launchers import TrainingLauncher
    from finetune_assets.defs.resources.mlflow import MlflowResource
    from finetune_assets.defs.resources.storage_root import StorageResource

    class Unreachable(TrainingLauncher):
        def launch(self, context, job) -> None:
            raise AssertionError("launched despite a bad config")

    run_config = {"ops": {"finetuned_model": {"config": config}}}
    resources = {
        "storage": StorageResource(root=str(tmp_path)),
        "mlflow": MlflowResource(),
        "launcher": Unreachable(),
    }
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("dataset_versions", ["v1"])
        try:
            result = dg.materialize(
                [finetuned_model],
                partition_key="v1",
                instance=instance,
                run_config=run_config,
                resources=resources,
                raise_on_error=False,
            )
        except dg.DagsterInvalidConfigError as err:  # a choice outside the Enum: refused at launch
            assert needle in str(err)
            return
    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error
    text = failure.to_string()  # the pydantic error is the step error's cause
    assert f"validation error for FinetuneConfig\n{needle}\n" in text


def test_checkpoints_by_steps_by_default_and_a_time_interval_replaces_them():
    assert TrainerConfig.from_dict(_cfg()).checkpoint_every_n_steps == 500
    timed = TrainerConfig.from_dict(_cfg(checkpoint_every_minutes=5.0))
    assert timed.checkpoint_every_n_steps is None and timed.checkpoint_every_minutes == 5.0
    with pytest.raises(ConfigError, match="not both"):
        TrainerConfig.from_dict(_cfg(checkpoint_every_minutes=5.0, checkpoint_every_n_steps=3))


def test_gpu_settings_are_chosen_in_one_place_and_cpu_keeps_the_config():
    from finetune_assets.core.training.device_settings import (
        adamw_options,
        ddp_strategy,
        eval_batch_size,
    )

    assert TrainerConfig.from_dict(_cfg()).eval_batch_size is None
    assert eval_batch_size(8, None, gpu=False) == 8 and eval_batch_size(8, None, gpu=True) == 32
    assert eval_batch_size(8, 5, gpu=True) == 5
    import torch

    assert adamw_options(torch.device("cpu")) == {}
    assert adamw_options(torch.device("cuda", 0)) == {"fused": True}
    assert ddp_strategy("bf16-mixed", gpu=False) == "ddp" == ddp_strategy("32-true", gpu=True)
    hook = ddp_strategy("bf16-mixed", gpu=True)._ddp_comm_hook
    assert hook.__name__ == "bf16_compress_hook"
