"""The gate's defaults protect a user who configured nothing, on every path that can promote."""

from __future__ import annotations

import dagster as dg

from finetune_assets.core.evaluation import gate_rules as gate
from finetune_assets.core.io.storage import Storage
from finetune_assets.definitions import defs as load_defs
from finetune_assets.defs.automation import AFTER_UPSTREAM
from finetune_assets.defs.jobs import VERSION_CHAIN
from finetune_assets.defs.promotion import PromotionConfig, QualityGateConfig, gate_conditions

# 6 Positive, 2 Negative, 2 Mixed: always "Positive" scores macro-F1 0.25.
TEST = gate.TestSet.build(
    [f"review {i}" for i in range(10)], ["Positive"] * 6 + ["Negative"] * 2 + ["Mixed"] * 2
)


def _refusals(config, store: Storage, score: float) -> tuple[str, ...]:
    conditions, _ = gate_conditions(config, TEST, store, "v1")
    first = gate.Comparison(gate.Challenger("m", "1", score), None, None, TEST)  # no champion yet
    return tuple(r for cond in conditions if (r := cond(first)) is not None)


def test_a_first_model_no_better_than_the_majority_class_is_not_promoted(tmp_path):
    majority = gate.majority_baseline(TEST)
    assert majority == 0.25
    for config in (QualityGateConfig(), PromotionConfig()):
        # what the landing-zone run scored
        refusals = _refusals(config, Storage(str(tmp_path)), majority)
        assert any("below the floor" in r for r in refusals), refusals


def test_a_version_without_its_baseline_is_refused_unless_the_rule_is_off(tmp_path):
    store = Storage(str(tmp_path))  # baseline_model[v1] never built
    refusals = _refusals(QualityGateConfig(), store, 0.9)
    assert refusals == (
        "baseline_model[v1] is not materialized (or has no test scores): the baseline "
        "rule cannot be checked (baseline_margin: null turns it off)",
    )
    _, about = gate_conditions(QualityGateConfig(), TEST, store, "v1")
    assert about["baseline_decision"].startswith("refused: baseline_model[v1] is not materialized")
    assert _refusals(QualityGateConfig(baseline_margin=None), store, 0.9) == ()  # turned off


def test_every_path_that_can_promote_builds_the_baseline():
    baseline = dg.AssetKey("baseline_model")
    assert baseline in {a.key for a in VERSION_CHAIN}
    # automation builds it with its version's data (test_automation: in the data run)
    assert load_defs().resolve_asset_graph().get(baseline).automation_condition == AFTER_UPSTREAM
    job = load_defs().resolve_job_def("retrain_job")
    assert baseline in job.asset_layer.executable_asset_keys
