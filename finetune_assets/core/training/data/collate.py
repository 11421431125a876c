"""Dynamic padding: each batch is padded to its own longest sequence, not to the model maximum.

Reviews are short (median well under 64 tokens), so padding to 512 as the seed did spends most of
the compute on pad tokens; padding per batch is the main throughput win on any hardware.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

# cross-entropy's and torchmetrics' ignore_index: a padding or repeated sample counts nowhere
PAD_LABEL = -100


class DynamicPaddingCollator:
    """Collate MDS samples ``{"input_ids": uint16 array, "label": int}`` into model inputs.

    Returns ``input_ids``/``attention_mask`` (``[batch, longest]``), ``labels``, and as ``int``
    ``num_samples`` and ``num_tokens`` (real, non-pad tokens, for tokens/s; the train loader lowers
    both for samples it masks as repeats). Sequences longer than ``max_length`` are cut
    and keep their final ``[SEP]`` so the model sees a well-formed input.
    """

    def __init__(self, pad_token_id: int = 0, max_length: int = 512, pad_to: int | None = None):
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        if pad_to is not None and pad_to < 1:
            raise ValueError(f"pad_to must be positive, got {pad_to}")
        self.pad_token_id = pad_token_id
        self.max_length = max_length
        self.pad_to = pad_to  # fixed width (the notebook's pad-to-512), benchmarks only

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not samples:
            raise ValueError("cannot collate an empty batch")
        seqs = []
        for s in samples:
            ids = np.asarray(s["input_ids"], dtype=np.int64)
            if ids.size > self.max_length:
                ids = np.concatenate([ids[: self.max_length - 1], ids[-1:]])
            seqs.append(ids)
        longest = max(len(ids) for ids in seqs)
        width = max(longest, self.pad_to or 0)
        input_ids = torch.full((len(seqs), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, ids in enumerate(seqs):
            input_ids[i, : len(ids)] = torch.from_numpy(ids)
            attention_mask[i, : len(ids)] = 1
        labels = torch.tensor([int(s["label"]) for s in samples], dtype=torch.long)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "num_samples": len(seqs),
            # an int, not a tensor: counting it never syncs a device
            "num_tokens": int(attention_mask.sum()),
        }
