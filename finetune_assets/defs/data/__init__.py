"""Data: a dataset version's reviews, tokens and shards, the base model they are tokenized for, and
the checks guarding them.

Assets: :mod:`.raw` (``raw_reviews``), :mod:`.pretrained` (``pretrained_model``), :mod:`.tokenized`
(``tokenized_reviews``), :mod:`.mds_shards` (``mds_shards``).

Checks guard the graph's edges. They read what the asset *published* (``Storage`` pointers), never
in-memory state, so they can be re-run alone from the UI. Severities: ERROR for what must stop the
pipeline (blocking: downstream assets in the same run do not execute; across runs, automation
conditions wait for passing blocking checks, and training refuses failed inputs:
:mod:`.upstream_checks`), WARN for what a person should look at but need not stop training.
Thresholds are check config (the launchpad's "ops" section, or ``run_config`` of a sensor/job), with
defaults that fit the real data. One module per guarded asset: :mod:`.raw_contract`,
:mod:`.vocab_check`, :mod:`.shard_integrity`; the model's ``quality_gate`` lives with promotion
(``finetune_assets/defs/promotion/gate_check.py``).
"""

from finetune_assets.defs.data.mds_shards import mds_shards
from finetune_assets.defs.data.pretrained import pretrained_model
from finetune_assets.defs.data.raw import raw_reviews
from finetune_assets.defs.data.raw_contract import raw_reviews_contract
from finetune_assets.defs.data.shard_integrity import mds_shards_integrity
from finetune_assets.defs.data.tokenized import tokenized_reviews
from finetune_assets.defs.data.vocab_check import vocabulary_fit

__all__ = ["asset_checks", "assets", "mds_shards_integrity", "raw_reviews_contract"]

assets = [raw_reviews, pretrained_model, tokenized_reviews, mds_shards]
asset_checks = [raw_reviews_contract, mds_shards_integrity, vocabulary_fit]
