"""Dynamic padding: batches padded to their longest sequence, labels and masks kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from finetune_assets.core.training.data.collate import DynamicPaddingCollator


def _s(ids, label=0):
    return {"input_ids": np.asarray(ids, dtype=np.uint16), "label": np.int8(label)}


def test_pads_to_longest_in_batch_with_mask():
    batch = DynamicPaddingCollator(pad_token_id=0)([_s([101, 5, 102]), _s([101, 7, 8, 9, 102], 2)])
    assert batch["input_ids"].shape == (2, 5)
    assert batch["input_ids"].tolist() == [[101, 5, 102, 0, 0], [101, 7, 8, 9, 102]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["labels"].tolist() == [0, 2] and batch["labels"].dtype == torch.long
    assert int(batch["num_tokens"]) == 8


def test_truncates_keeping_sep_and_fixed_width_for_benchmarks():
    c = DynamicPaddingCollator(max_length=4, pad_to=6)
    batch = c([_s([101, 1, 2, 3, 4, 102])])
    assert batch["input_ids"].tolist() == [[101, 1, 2, 102, 0, 0]]
    assert int(batch["num_tokens"]) == 4


def test_rejects_empty_batch():
    with pytest.raises(ValueError, match="empty"):
        DynamicPaddingCollator()([])
