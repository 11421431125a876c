"""A re-execution reads what its root run read, and Dagster's lineage names the input actually used.

Scenario: version v1 is built, training fails, ``pretrained_model`` is rebuilt from another base
model, and the failed run is re-executed from failure (a new run id, the same root run id: what a
person does from the UI and what the daemon's run retries do, ``ReexecutionOptions.from_failure``).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
from pathlib import Path

import dagster as dg
from dagster._core.definitions.data_version import StaleStatus

from finetune_assets.core.io.contracts import PRETRAINED_MODEL
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.sources import SourceSpec
from finetune_assets.defs.resources.mlflow import MlflowResource
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets.defs.versions.register import write_version
from finetune_assets_tests.defs.test_staleness import (
    CHAIN,
    CopyLauncher,
    _base,
    _chain_assets,
    _status,
)

ROOT_ENV = "PROVENANCE_TEST_ROOT"  # the storage root of the reconstructed job (set by the test)


class FailOnceLauncher(CopyLauncher):
    """Fails the first training (a lost pod, say), then 'trains' like ``CopyLauncher``; records what
    each attempt trained from (``model_dir`` of the trainer config) in
    ``{root}/trained_from.jsonl``.
    """

    def launch(self, context, job) -> None:
        root = Path(os.environ[ROOT_ENV])
        cfg = json.loads(Path(job.config_url).read_text())
        with (root / "trained_from.jsonl").open("a") as f:
            f.write(
                json.dumps({"run_id": context.run.run_id, "model_dir": cfg["model_dir"]}) + "\n"
            )
        marker = root / "fail-next"
        if marker.exists():
            marker.unlink()
            raise RuntimeError("training pod lost")
        super().launch(context, job)


def chain_job() -> dg.JobDefinition:
    """Reconstructable (re-execution loads the job by reference), in-process, one root from the
    env.
    """
    defs = dg.Definitions(
        assets=_chain_assets(),
        jobs=[dg.define_asset_job("chain", selection=CHAIN, executor_def=dg.in_process_executor)],
        resources={
            "storage": StorageResource(root=os.environ[ROOT_ENV]),
            "mlflow": MlflowResource(),
            "launcher": FailOnceLauncher(),
        },
    )
    return defs.resolve_job_def("chain")


def _materialize_base(instance, root: Path, source: Path) -> None:
    result = dg.materialize(
        _chain_assets(),
        selection=[PRETRAINED_MODEL],
        instance=instance,
        run_config=_base(source, 0),
        resources={
            "storage": StorageResource(root=str(root)),
            "mlflow": MlflowResource(),
            "launcher": CopyLauncher(),
        },
    )
    assert result.success


def test_reexecution_trains_with_the_base_model_its_shards_were_tokenized_with(
    instance, storage_root, tiny_model_dir, arabic_reviews, tmp_path, monkeypatch
):
    from finetune_assets_tests.tiny_models import build_tiny_bert

    monkeypatch.setenv(ROOT_ENV, str(storage_root))
    store = Storage(str(storage_root))
    small = tmp_path / "reviews.csv"  # the first 150 real reviews: enough for three splits, fast
    with (
        open(arabic_reviews / "PROD.csv", encoding="utf-8", newline="") as src,
        small.open("w", encoding="utf-8", newline="") as dst,
    ):
        csv.writer(dst).writerows(itertools.islice(csv.reader(src), 151))
    write_version(store, "v1", SourceSpec(uri=str(small)))
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    _materialize_base(instance, storage_root, tiny_model_dir)
    old = store.require(PRETRAINED_MODEL)

    (storage_root / "fail-next").touch()
    job = dg.reconstructable(chain_job)
    with dg.execute_job(job, instance, tags={"dagster/partition": "v1"}) as first:
        assert not first.success
        assert first.is_node_success("tokenized_reviews") and first.is_node_failed(
            "finetuned_model"
        )
        first_id = first.run_id

    _materialize_base(instance, storage_root, build_tiny_bert(tmp_path / "other-base", seed=1))
    new = store.require(PRETRAINED_MODEL)
    assert new.data_version != old.data_version

    options = dg.ReexecutionOptions.from_failure(first_id, instance)
    # The UI and the daemon's retries copy the parent's tags (the partition); execute_job does not.
    with dg.execute_job(
        job, instance, reexecution_options=options, tags={"dagster/partition": "v1"}
    ) as again:
        assert again.success and again.dagster_run.root_run_id == first_id
        mat = again.asset_materializations_for_node("finetuned_model")[0]

    trained = [
        json.loads(line) for line in (storage_root / "trained_from.jsonl").read_text().splitlines()
    ]
    # the shards' tokenizer, both times
    assert [t["model_dir"] for t in trained] == [
        old.url,
        old.url,
    ]
    # Lineage: Dagster's record says the old base model (data version and event), not the newest
    # one.
    assert mat.tags[f"dagster/input_data_version/{PRETRAINED_MODEL}"] == old.data_version
    pointer = int(mat.tags[f"dagster/input_event_pointer/{PRETRAINED_MODEL}"])
    used = instance.fetch_materializations(dg.AssetKey(PRETRAINED_MODEL), limit=10).records
    by_id = {r.storage_id: r.asset_materialization.tags["dagster/data_version"] for r in used}
    assert by_id[pointer] == old.data_version
    assert mat.metadata["pretrained_model"].value == old.url
    # ... so the UI shows the model stale against the new base model, as it is.
    assert _status(_chain_assets(), instance)["finetuned_model"] == StaleStatus.STALE
