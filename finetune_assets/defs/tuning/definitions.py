"""The code location, tuning every new version before training it (``defs/tuning/on_landing.py``):
load this module instead of ``finetune_assets.definitions`` (``dagster dev -m
finetune_assets.defs.tuning.definitions``, or ``module_name`` in ``workspace.yaml`` / the chart's
``dagsterApiGrpcArgs``).
"""

from __future__ import annotations

import dagster as dg

from finetune_assets.definitions import build_defs


@dg.definitions
def defs() -> dg.Definitions:
    return build_defs(tune_new_versions=True)
