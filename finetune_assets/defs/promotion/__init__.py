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
    "champion",
    "champion_model",
    "frozen_test_set",
    "gate_conditions",
    "quality_gate",
    "recorded_model",
    "version_labels",
]
