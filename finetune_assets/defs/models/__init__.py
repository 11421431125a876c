"""Models of a dataset version: ``finetuned_model`` (trained through a launcher, :mod:`.finetuned`)
and ``baseline_model``, the TF-IDF bar it must clear (:mod:`.baseline_model`).
"""

from finetune_assets.defs.models.baseline_model import baseline_model
from finetune_assets.defs.models.finetuned import finetuned_model

__all__ = ["assets"]

assets = [finetuned_model, baseline_model]
