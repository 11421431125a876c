"""Run tags of the tune-then-train path (defs/tuning/on_landing.py), apart so the asset reads them
without importing the jobs.
"""

AUTO_TUNE_TAG = "finetune_assets/auto_tune"  # on a tune_job run the sensor made: train the winner
TUNED_BY_TAG = (
    "finetune_assets/tuned_by_run"  # on the final run: the tune run it trains the winner of
)
# on a final run trained with the default recipe instead: why the study's winner was not used
FALLBACK_TAG = "finetune_assets/tuning_fallback"
