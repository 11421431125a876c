"""``finetuned_model[v]``: BERT fine-tuned on ``mds_shards[v]`` by torchrun (through a launcher),
tracked in MLflow.
"""

import hashlib
import json
import re
from importlib import metadata as importlib_metadata
from typing import Any, ClassVar, Literal

import dagster as dg
import fsspec
from pydantic import Field

from finetune_assets.core.evaluation import charts as viz
from finetune_assets.core.io.contracts import (
    BEST_FILE,
    FINETUNED_MODEL,
    MDS_SHARDS,
    MODEL_SUBDIR,
    PRETRAINED_MODEL,
    TRAIN,
    TRAINER_CONFIG_FILE,
    TUNING_STUDY,
    TrainingResult,
    read_split_stats,
    read_training_result,
)
from finetune_assets.core.io.storage import Published, Storage, hash_tree
from finetune_assets.core.labels.infer import (
    DEFAULT_LABEL_SET,
    labels_from_metadata,
    registered_model_name,
)
from finetune_assets.core.launchers.base import TrainingSpec
from finetune_assets.core.training.config import TrainerConfig
from finetune_assets.core.training.hyperparameters import HyperParameters
from finetune_assets.defs.common import (
    launch_labels,
    markdown_table,
    version_asset,
    version_of,
)
from finetune_assets.defs.data.upstream_checks import refuse_failed_inputs
from finetune_assets.defs.provenance import input_tags, read_recorded, run_group_id
from finetune_assets.defs.resources.launchers import TrainingLauncher
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource


class FinetuneConfig(dg.Config, HyperParameters):
    """The trainer's ``HyperParameters`` (fields, bounds, choices, defaults:
    core/training/hyperparameters.py)
    plus the run name.
    """

    # Fields that cannot change the trained model: left out of the code version (defs/staleness.py).
    # hyper_parameters_from: "config" (the default) changes nothing; "study" is a launchpad
    # choice, recorded in the run.
    unversioned: ClassVar[tuple[str, ...]] = (
        "run_name",
        "num_workers",
        "log_every_n_steps",
        "checkpoint_every_n_steps",
        "checkpoint_every_minutes",
        "progress_every_seconds",
        "hyper_parameters_from",
    )

    run_name: str | None = Field(None, description="MLflow run name (default: the Dagster run)")
    hyper_parameters_from: Literal["config", "study"] = Field(
        "config",
        description="config: the fields here; study: the searched fields and the study's fixed "
        "settings from tuning_study[v]'s best trial (materialize it first), the rest here",
    )


def tuned(
    config: FinetuneConfig, store: Storage, version: str
) -> tuple[FinetuneConfig, dict[str, Any] | None]:
    """``config`` with the best parameters of the version's study when asked, and that trial."""
    if config.hyper_parameters_from == "config":
        return config, None
    published = store.current(TUNING_STUDY, version)
    if published is None:
        raise dg.Failure(
            f"hyper_parameters_from 'study': {TUNING_STUDY}[{version}] has never been "
            "materialized; materialize it first (README: 'Tune the hyper-parameters "
            "of a version')"
        )
    best = store.read_json(f"{published.url}/{BEST_FILE}")
    best["data_version"] = published.data_version
    # the study's fixed settings too (max_length, clipping ...): the winner is what it measured
    return config.model_copy(update={**best.get("fixed", {}), **best["params"]}), best


TRAINING_POOL = "training"
# A backfill policy unlike the data assets' (none): Dagster's asset backfill never puts a data step
# and training in one run, so a training run waits in the run queue, not in a run pod
# (defs/jobs.py).
TRAINING_BACKFILL = dg.BackfillPolicy.multi_run(max_partitions_per_run=1)


def code_version() -> str:
    try:
        return importlib_metadata.version("finetune_assets")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def job_name(version: str, run_id: str) -> str:
    """DNS-1123 label: lowercase alphanumerics and '-', at most 63 characters."""
    slug = re.sub(r"[^a-z0-9-]+", "-", version.lower()).strip("-")[:40] or "v"
    return f"finetune-{slug}-{run_id[:8]}".strip("-")


def build_trainer_config(
    config: FinetuneConfig,
    store: Storage,
    shards: Published,
    version: str,
    mlflow: MlflowResource,
    output_dir: str,
    tags: dict[str, str],
    run_name: str,
    pin_id: str,
) -> tuple[TrainerConfig, str, Published]:
    """The trainer file for one attempt, the hash keying its checkpoints (same inputs -> same
    folder), and the base model it trains from (pinned for ``pin_id``, the root run). ``shards``:
    the published ``mds_shards[version]`` Dagster recorded (``read_recorded``).
    """
    # The base model the root run started with (its tokenize step pinned it, leased), not whatever
    # CURRENT is now: a re-execution from failure or a run retry trains with the shards' tokenizer.
    pretrained = store.pinned(PRETRAINED_MODEL, pin_id)
    labels = labels_from_metadata(shards.metadata)
    settings = config.hyper_parameters()
    key = {
        "settings": settings,
        "shards": shards.data_version,
        "pretrained": pretrained.data_version,
    }
    # the default three classes keep their checkpoint keys
    if labels.names != DEFAULT_LABEL_SET.names:
        key["labels"] = list(labels.names)
    key = json.dumps(key, sort_keys=True)
    config_hash = hashlib.sha256(key.encode()).hexdigest()[:16]
    trainer = TrainerConfig.from_dict(
        {
            **settings,
            "data": {
                "train_url": f"{shards.url}/train",
                "validation_url": f"{shards.url}/validation",
                "test_url": f"{shards.url}/test",
                # None: each worker node caches the shards in a temp folder keyed by the checkpoint
                # dir and the shard indexes (the published shards are the remote, never read in
                # place).
                "local_cache_dir": None,
                # Forward only: the trainer gets the train split's label counts from here, never by
                # counting.
                "train_label_counts": read_split_stats(f"{shards.url}/{TRAIN}", store.fs).counts(
                    len(labels.names), where=f"{MDS_SHARDS}[{version}]/{TRAIN}"
                ),
            },
            "model_dir": pretrained.url,
            "labels": list(labels.names),
            "output_dir": output_dir,
            "checkpoint_dir": store.url(FINETUNED_MODEL, version, "checkpoints", config_hash),
            "mlflow": {
                "tracking_uri": mlflow.resolve_tracking_uri(store),
                "experiment_name": mlflow.experiment_name,
                "artifact_location": mlflow.artifact_location(store),
                "registered_model_name": registered_model_name(
                    mlflow.registered_model_name, labels
                ),
                "run_name": config.run_name or run_name,
                "tags": {
                    **tags,
                    "labels": ",".join(labels.names),
                    "shard_data_version": shards.data_version,
                    "pretrained_data_version": pretrained.data_version,
                    # hashes the same inputs + settings as the checkpoint folder: a retry finds its
                    # version
                    "training_inputs": (
                        registered_model_name(mlflow.registered_model_name, labels)
                        + f"-{config_hash}"
                    ),
                },
            },
        }
    )
    return trainer, config_hash, pretrained


@version_asset(
    "models",
    {"pytorch", "mlflow"},
    deps=[MDS_SHARDS, PRETRAINED_MODEL],
    # limit concurrent trainings (CPU/GPU memory, the embedded store): docs/reliability.md
    pool=TRAINING_POOL,
    backfill_policy=TRAINING_BACKFILL,
    # bump for a change of the training code; config defaults are folded in (defs/staleness.py)
    code_version="1",
)
def finetuned_model(
    context: dg.AssetExecutionContext,
    config: FinetuneConfig,
    storage: StorageResource,
    launcher: TrainingLauncher,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """BERT review classifier fine-tuned by torchrun on the MDS shards; metrics and MLflow
    version attached.
    """
    version = version_of(context)
    refuse_failed_inputs(context.instance, version, FINETUNED_MODEL)
    store = storage.storage()
    run_id = context.run.run_id
    tags = {"dataset_version": version, "code_version": code_version(), "dagster_run_id": run_id}
    shards = read_recorded(context.instance, store, MDS_SHARDS, version)
    config, best = tuned(config, store, version)
    if best is not None:
        tags.update({"tuning_study": best["study_name"], "tuned_from_trial": str(best["trial"])})
        context.log.info(
            f"hyper-parameters of {best['study_name']} trial {best['trial']}: {best['params']}"
        )
    with store.publish(FINETUNED_MODEL, version) as staging:
        # Pods cannot see this machine's staging folder: with a remote root they write to the
        # attempt URL.
        output_dir = str(staging.local_dir) if store.is_local else staging.url
        trainer, config_hash, pretrained = build_trainer_config(
            config,
            store,
            shards,
            version,
            mlflow,
            output_dir,
            tags,
            run_name=f"{version}-{run_id[:8]}",
            pin_id=run_group_id(context.run),
        )
        config_url = f"{output_dir}/{TRAINER_CONFIG_FILE}"
        with fsspec.open(
            config_url, "w"
        ) as f:  # inside the attempt: published (or discarded) with it
            f.write(trainer.to_json())
        context.log.info(f"trainer config {config_url}; checkpoints {trainer.checkpoint_dir}")
        launcher.launch(
            context,
            TrainingSpec(
                name=job_name(version, run_id),
                config_url=config_url,
                labels=launch_labels(context, FINETUNED_MODEL, version),
            ),
        )
        result = read_training_result(output_dir)
        with store.local_copy(f"{output_dir}/{MODEL_SUBDIR}") as model_dir:
            staging.data_version = hash_tree(model_dir)
        staging.metadata = {
            "config_hash": config_hash,
            "mlflow": result.mlflow,
            "pretrained_attempt": pretrained.attempt,
        }
        if best is not None:
            staging.metadata["tuned_from_trial"] = best["trial"]
    meta = _metadata(result, mlflow, staging.url, config_hash)
    meta["pretrained_model"] = dg.MetadataValue.path(pretrained.url)
    if best is not None:
        meta.update(
            {
                "tuned_from_trial": best["trial"],
                "tuned_params": dg.MetadataValue.json(best["params"]),
                "tuning_study": f"{best['study_name']} (data version {best['data_version']})",
            }
        )
    return dg.MaterializeResult(
        metadata=meta,
        data_version=dg.DataVersion(staging.data_version),
        tags=input_tags(context.instance, PRETRAINED_MODEL, pretrained),
    )


def _metadata(
    result: TrainingResult, mlflow: MlflowResource, url: str, config_hash: str
) -> dict[str, Any]:
    info = result.mlflow
    meta: dict[str, Any] = {
        "model_path": dg.MetadataValue.path(f"{url}/{MODEL_SUBDIR}"),
        "samples_seen": result.samples_seen,
        "samples_per_sec": result.samples_per_sec,
        "tokens_per_sec": result.tokens_per_sec,
        "global_step": result.global_step,
        "world_size": result.world_size,
        "checkpoint_key": config_hash,
    }
    if result.test_skipped:  # an empty test split: trained, not tested
        meta["test"] = result.test_skipped
    else:
        meta.update(
            {
                "accuracy": dg.MetadataValue.float(float(result.accuracy)),
                "macro_f1": dg.MetadataValue.float(float(result.macro_f1)),
                "f1_per_class": markdown_table(
                    ("class", "F1"), [(k, f"{v:.4f}") for k, v in result.f1_per_class.items()]
                ),
                "confusion_matrix": dg.MetadataValue.json(
                    {"rows_true_cols_pred": result.confusion_matrix}
                ),
            }
        )
        try:  # a picture is a nicety: a plotting error must never fail a finished training
            meta["confusion_matrix_chart"] = dg.MetadataValue.md(
                viz.confusion_matrix_md(result.confusion_matrix, result.labels)
            )
        except Exception as err:  # any plotting/encoding error
            dg.get_dagster_logger().warning(f"confusion matrix chart skipped: {err}")
    meta["test_samples"] = result.test_samples
    if result.class_weights:
        meta["class_weights"] = dg.MetadataValue.json(
            dict(zip(result.labels, result.class_weights))
        )
    for name, value in result.f1_per_class.items():
        meta[f"f1_{name}"] = dg.MetadataValue.float(float(value))
    # the steady-state window, all ranks and per device (core/training/throughput.py)
    for key in (
        "flops_per_sec",
        "device_samples_per_sec",
        "device_flops_per_sec",
        "padded_tokens_per_sec",
        "mfu",
    ):
        if result.throughput.get(key) is not None:
            meta[f"throughput_{key}"] = dg.MetadataValue.float(float(result.throughput[key]))
    if result.precision:  # as resolved on the training machine (precision "auto")
        meta["precision"] = result.precision
    if result.resumed_at_step is not None:
        meta["resumed_at_step"] = result.resumed_at_step
    meta.update(_selection_metadata(result))
    if info.get("run_id"):
        meta["mlflow_run_id"] = info["run_id"]
        link = info.get("run_url") or mlflow.run_url(str(info.get("experiment_id")), info["run_id"])
        if link:
            meta["mlflow_run"] = dg.MetadataValue.url(link)
    if info.get("registered_model_version") is not None:
        meta["registered_model"] = (
            f"{info['registered_model_name']} v{info['registered_model_version']}"
        )
        meta["registered_model_version"] = int(info["registered_model_version"])
        meta["registered_model_name"] = str(info["registered_model_name"])
        link = mlflow.model_version_url(
            info["registered_model_name"], info["registered_model_version"]
        )
        if link:
            meta["registered_model_link"] = dg.MetadataValue.url(link)
    return meta


def _selection_metadata(result: TrainingResult) -> dict[str, Any]:
    """Which validation's weights were exported, whether early stopping fired, and the curve."""
    sel = result.model_selection
    if sel is None:
        return {}
    meta: dict[str, Any] = {"selected_weights": sel.selected, "early_stopped": sel.early_stopped}
    if sel.best_epoch is not None:
        meta["best_epoch"] = sel.best_epoch
        meta["best_step"] = sel.best_step
        meta["best_val_macro_f1"] = dg.MetadataValue.float(float(sel.best_value))
    if sel.stopped_at_epoch is not None:
        meta["stopped_at_epoch"] = sel.stopped_at_epoch
    if sel.curve:
        meta["validation_curve"] = markdown_table(
            ("epoch", "step", sel.metric), [(p.epoch, p.step, f"{p.value:.4f}") for p in sel.curve]
        )
    if sel.note:
        meta["selection_note"] = sel.note
    return meta
