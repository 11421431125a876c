"""``pretrained_model``: the base BERT (weights + tokenizer + config) every version fine-tunes
from.
"""

import dagster as dg
from pydantic import Field

from finetune_assets.core.io.contracts import PRETRAINED_MODEL
from finetune_assets.core.io.storage import hash_tree
from finetune_assets.core.prep.pretrained import DEFAULT_MODEL, save_pretrained_model
from finetune_assets.defs.common import OWNERS
from finetune_assets.defs.resources.storage_root import StorageResource


class PretrainedModelConfig(dg.Config):
    source: str = Field(
        DEFAULT_MODEL,
        description="hub id (bert-base-uncased), a local HF folder, or the packaged offline "
        "default",
    )
    revision: str | None = Field(None, description="hub revision (branch, tag or commit)")
    seed: int = Field(0, description="seed for the freshly initialised classification head")


@dg.asset(group_name="models", kinds={"pytorch", "huggingface"}, owners=OWNERS, code_version="2")
def pretrained_model(
    context: dg.AssetExecutionContext, config: PretrainedModelConfig, storage: StorageResource
) -> dg.MaterializeResult:
    """Base BERT for 3-class review classification, saved with save_pretrained (safetensors)."""
    store = storage.storage()
    with store.publish(PRETRAINED_MODEL) as staging:
        summary = save_pretrained_model(
            config.source, config.revision, staging.local_dir, seed=config.seed
        )
        staging.data_version = hash_tree(staging.local_dir)
        staging.metadata = {"source": config.source, "revision": config.revision}
    context.log.info(f"saved {summary.architecture} from {summary.resolved} to {staging.url}")
    return dg.MaterializeResult(
        metadata={
            "source": config.source,
            "revision": config.revision or "default",
            "resolved": summary.resolved,
            "architecture": summary.architecture,
            "parameters": summary.parameters,
            "vocab_size": summary.vocab_size,
            "max_position_embeddings": summary.max_position_embeddings,
            "path": dg.MetadataValue.path(staging.url),
        },
        data_version=dg.DataVersion(staging.data_version),
    )
