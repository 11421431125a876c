"""The automation conditions that build a version (``defs/automation.py``), tick by tick, evaluated
by
Dagster itself (``dg.evaluate_automation_conditions``, the daemon's evaluation without the daemon)
over the real definitions and a real instance. What a run would have done is reported as runless
events (materializations, check evaluations); a tick with nothing reported since the last is a run
that ended without materializing (cancelled, failed). ``test_automation_daemon.py`` runs the same
path through the daemon with real runs.
"""

from __future__ import annotations

import pytest

from finetune_assets.core.io.contracts import (
    BASELINE_MODEL,
    FINETUNED_MODEL,
    MDS_SHARDS,
    PRETRAINED_MODEL,
    RAW_REVIEWS,
    TOKENIZED_REVIEWS,
    TUNING_STUDY,
)
from finetune_assets.definitions import build_defs
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS
from finetune_assets_tests.defs.automation_ticks import DATA, TRAINING, Ticks


@pytest.fixture
def ticks(instance, storage_root) -> Ticks:
    t = Ticks(instance, build_defs(str(storage_root)))
    t.ran([PRETRAINED_MODEL], None)  # the base model exists (the daemon test builds it)
    assert t.tick() == set()  # the sensor ticks before any version lands
    return t


def _of(requested, version: str) -> set[str]:
    return {asset for asset, pk in requested if pk == version}


def test_data_in_one_tick_training_on_the_next_and_an_ended_run_is_not_requested_again(ticks):
    ticks.instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    assert _of(ticks.tick(), "v1") == DATA  # one run: Dagster groups a tick's requests by partition
    assert ticks.tick() == set()  # the data run ended without materializing: not requested again
    ticks.ran(DATA, "v1")
    # training, the gate's promotion and the scores behind it, never in the data's run
    assert _of(ticks.tick(), "v1") == TRAINING
    assert ticks.tick() == set()  # the training run was cancelled: not requested again
    ticks.ran(TRAINING, "v1")
    assert ticks.tick() == set()


def test_a_version_registered_before_the_first_tick_is_built(instance, storage_root):
    ticks = Ticks(instance, build_defs(str(storage_root)))
    ticks.ran([PRETRAINED_MODEL], None)
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    assert _of(ticks.tick(), "v1") == DATA


def test_a_fresh_deployment_builds_the_base_model_once_and_the_versions_wait_for_it(
    instance, storage_root
):
    ticks = Ticks(instance, build_defs(str(storage_root)))
    assert ticks.tick() == {(PRETRAINED_MODEL, None)}  # missing from the first tick on
    assert ticks.tick() == set()  # its build failed or was cancelled: not requested again
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    # what of v1 does not need the base model; tokenizing waits for it
    assert ticks.tick() == {(RAW_REVIEWS, "v1"), (BASELINE_MODEL, "v1")}
    ticks.ran([RAW_REVIEWS, BASELINE_MODEL], "v1")
    assert ticks.tick() == set()
    ticks.ran([PRETRAINED_MODEL], None)  # built by a person (base_model_job)
    assert ticks.tick() == {(TOKENIZED_REVIEWS, "v1"), (MDS_SHARDS, "v1")}


def test_two_versions_are_built_apart_and_a_rebuilt_base_model_retrains_nothing(ticks):
    ticks.instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1", "v2"])
    first = ticks.tick()
    assert _of(first, "v1") == _of(first, "v2") == DATA
    ticks.ran(DATA, "v2")
    assert ticks.tick() == {(a, "v2") for a in TRAINING}  # v2 does not wait for v1
    ticks.ran(TRAINING, "v2")
    ticks.ran([PRETRAINED_MODEL], None)
    assert ticks.tick() == set()  # every version stale instead; a person chooses


def test_training_waits_while_its_shards_fail_a_blocking_check(ticks):
    ticks.instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    ticks.tick()
    ticks.ran(DATA, "v1", failed={"splits_readable": MDS_SHARDS})
    assert ticks.tick() == set()
    assert ticks.tick() == set()  # (passing, it trains: the first test)


def test_a_failed_raw_contract_stops_the_chain(ticks):
    ticks.instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    ticks.tick()
    ticks.ran([RAW_REVIEWS], "v1", failed={"min_rows_per_class": RAW_REVIEWS})
    assert ticks.tick() == set()


def test_a_refused_gate_promotes_and_scores_nothing(ticks):
    ticks.instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    ticks.tick()
    ticks.ran(DATA, "v1")
    ticks.tick()
    ticks.ran([FINETUNED_MODEL], "v1", failed={"quality_gate": FINETUNED_MODEL})
    assert ticks.tick() == set()
    assert ticks.tick() == set()


def test_where_new_versions_are_tuned_the_study_takes_the_models_place(instance, storage_root):
    ticks = Ticks(instance, build_defs(str(storage_root), tune_new_versions=True))
    ticks.ran([PRETRAINED_MODEL], None)
    assert ticks.tick() == set()
    instance.add_dynamic_partitions(DATASET_VERSIONS, ["v1"])
    assert _of(ticks.tick(), "v1") == DATA
    ticks.ran(DATA, "v1")
    assert _of(ticks.tick(), "v1") == {TUNING_STUDY}  # tuned_retrain_sensor trains the winner
