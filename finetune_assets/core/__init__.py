"""The Dagster-free core, by concern: what runs in a pod or a CLI without a Dagster instance.

Nothing under ``core/`` imports Dagster (``finetune_assets_tests/test_layers.py``).
"""
