"""``tune_job``: a hyper-parameter study for one dataset version, by hand."""

from finetune_assets.defs.data.mds_shards import mds_shards
from finetune_assets.defs.data.pretrained import pretrained_model
from finetune_assets.defs.data.raw import raw_reviews
from finetune_assets.defs.data.tokenized import tokenized_reviews
from finetune_assets.defs.jobs import asset_job
from finetune_assets.defs.models.baseline_model import baseline_model
from finetune_assets.defs.tuning.study_asset import tuning_study

# The chain up to the shards and the gate's baseline, then the study (not the model: in one run
# nothing orders tuning_study before finetuned_model). defs/tuning/on_landing.py trains the winner
# after.
TUNE_CHAIN = (raw_reviews, tokenized_reviews, mds_shards, baseline_model, tuning_study)

tune_job = asset_job(
    "tune",
    (*TUNE_CHAIN, pretrained_model),
    "A hyper-parameter study for one dataset version: the chain up to mds_shards, baseline_model, "
    "and tuning_study, by hand. A deployment that tunes every new version loads "
    "finetune_assets.defs.tuning.definitions: automation then requests tuning_study after the "
    "version's data run, and tuned_retrain_sensor trains the study's winner with "
    "finetune_only_job.",
)
