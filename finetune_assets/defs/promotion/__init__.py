"""Promotion: when a fine-tuned model becomes ``@champion``.

The Dagster side of one decision, in one folder: :mod:`.gate_check` (the ``quality_gate`` check:
scores and observes), :mod:`.champion` (``champion_model[v]`` acts: moves the alias; ``champion``
shows who holds it) and :mod:`.recorded_model` (which materialization both act on). The rules
themselves are Dagster-free in ``finetune_assets/core/evaluation/gate_rules.py``.
"""

from finetune_assets.defs.promotion.champion import PromotionConfig, champion, champion_model
from finetune_assets.defs.promotion.gate_check import (
    FloorConfig,
    QualityGateConfig,
    frozen_test_set,
    gate_conditions,
    quality_gate,
    version_labels,
)
from finetune_assets.defs.promotion.recorded_model import RecordedModel, recorded_model

__all__ = [
    "FloorConfig",
    "PromotionConfig",
    "QualityGateConfig",
    "RecordedModel",
    "asset_checks",
    "assets",
    "champion",
    "champion_model",
    "frozen_test_set",
    "gate_conditions",
    "quality_gate",
    "recorded_model",
    "version_labels",
]

assets = [champion_model, champion]  # champion: reported by champion_model, nothing to configure
asset_checks = [quality_gate]
