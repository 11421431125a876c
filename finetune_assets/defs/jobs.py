"""Jobs over the asset graph: full retrain of one dataset version, retraining the model only, and
rebuilding the base model (``tune_job`` is the tuning feature's, ``defs/tuning/tune_job.py``).

Selections name the asset definitions themselves (``AssetSelection.assets(obj)``), so a renamed
asset cannot leave a job selecting nothing. Asset checks of the selected assets run in the same run
(an asset selection includes its checks), so the blocking data checks stop a bad version before it
reaches training.
"""

import warnings

import dagster as dg

from finetune_assets.defs.data.mds_shards import mds_shards
from finetune_assets.defs.data.pretrained import pretrained_model
from finetune_assets.defs.data.raw import raw_reviews
from finetune_assets.defs.data.tokenized import tokenized_reviews
from finetune_assets.defs.models.baseline_model import baseline_model
from finetune_assets.defs.models.finetuned import finetuned_model
from finetune_assets.defs.promotion.champion import champion_model

# Run retries (the daemon re-launches a failed run when dagster.yaml has ``run_retries: enabled:
# true``): only failures outside the assets' code (a killed run worker, a lost pod, a daemon
# restart), at most twice. A failed asset or a refused blocking check is a result, not an accident:
# it is not retried (a person decides, or the sensor's bounded re-request rule does, see
# docs/reliability.md).
RETRY_TAGS = {"dagster/max_retries": "2", "dagster/retry_on_asset_or_op_failure": "false"}

# The per-version chain, in two runs (defs/automation.py requests them). Data preparation holds no
# pool,
# so it never waits for a training slot; training (``finetuned_model`` in pool ``training``, then
# ``champion_model`` behind the gate, and ``benchmark_scores``) is a run of its own whose first step
# is in the pool, so with op-granularity pools the run queue keeps it queued, holding no run pod,
# until a training slot is free (``GlobalOpConcurrencyLimitsCounter`` blocks a run whose every root
# step waits for a slot; ``op_granularity_run_buffer: 0``). An asset backfill splits the same way
# because the two halves have different backfill policies. ``pretrained_model`` is unpartitioned and
# shared by every version. ``baseline_model`` is prepared with the data because the gate
# (``quality_gate``, a blocking check that depends on it) refuses a version without one: every path
# that can promote builds the baseline first.
DATA_PREPARATION = (raw_reviews, tokenized_reviews, mds_shards, baseline_model)
TRAINING = (finetuned_model, champion_model)
VERSION_CHAIN = (*DATA_PREPARATION, *TRAINING)

# retrain_job selects both halves on purpose (one version by hand); Dagster warns that their
# backfill policies differ and uses the smaller one (one partition per run), which is what we want.
# No preview or beta parameter, and Dagster warns whenever it resolves the job (the code server,
# the daemon, `dg check defs`), not where it is defined: there is no call of ours to scope it
# around, so this one filter is process-wide, for this job's message only.
warnings.filterwarnings(
    "ignore", message=r"Asset job retrain_job materializes assets with varying BackfillPolicies"
)


def asset_job(kind: str, assets: tuple, description: str, retried: bool = True):
    """``{kind}_job`` over ``assets`` (and their checks), tagged ``finetune_assets/job: {kind}``,
    with ``RETRY_TAGS`` where ``retried``.
    """
    return dg.define_asset_job(
        name=f"{kind}_job",
        selection=dg.AssetSelection.assets(*assets),
        description=description,
        tags={"finetune_assets/job": kind, **(RETRY_TAGS if retried else {})},
    )


retrain_job = asset_job(
    "retrain",
    (*VERSION_CHAIN, pretrained_model),
    "New data -> new model for one dataset version: raw_reviews -> tokenized_reviews -> mds_shards "
    "-> finetuned_model -> champion_model, and baseline_model (the gate's bar), with their checks, "
    "by hand (automation builds new versions by itself). pretrained_model is in the selection so a "
    "fresh deployment can build the base model in the same run; deselect it otherwise (it is "
    "shared by all versions, rebuilding it per version would make every version stale).",
)

finetune_only_job = asset_job(
    "finetune_only",
    TRAINING,
    "Retrain finetuned_model for chosen dataset versions on their existing shards, e.g. with new "
    "hyper-parameters (run config) or after pretrained_model was rebuilt from a new base model "
    "that shares the tokenizer. Launch it for one version or as a backfill over several.",
)

base_model_job = asset_job(
    "base_model",
    (pretrained_model,),
    "Rebuild pretrained_model (e.g. config source: a new base model). Every version's "
    "tokenized_reviews, mds_shards and finetuned_model then show as stale; 'Materialize stale' "
    "rebuilds only those.",
    retried=False,
)

jobs: list = [retrain_job, finetune_only_job, base_model_job]
