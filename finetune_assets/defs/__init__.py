"""The Dagster side, one folder per feature (versions, data, models, promotion, benchmarks,
tuning), each ``__init__`` listing what the feature contributes (``assets``, ``asset_checks``,
``jobs``, ``sensors``; ``finetune_assets/definitions.py`` merges them), plus what they share:
``resources/``, ``common.py`` (per-version assets and checks), ``provenance.py`` (which upstream
version a step read), ``automation.py``, ``jobs.py``, ``staleness.py`` and
``dagster_internals.py`` (every use of Dagster's private API).
"""
