"""Inference in length order: batches of similar length pad little, and each result goes back to its
input.

A batch is padded to its longest text, so batching inputs as they come (a short review beside a long
one) spends most of the compute on padding. Sorting the whole input by length first, then restoring
the order, gives the same answers faster (benchmarks/results/defaults.json, ``predict``). Character
length stands in for token length: no second tokenization pass. Longest first, so a batch too large
for memory fails at the start, not after the run's short texts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def length_sorted_batches(texts: Sequence[str], batch_size: int) -> Iterator[list[int]]:
    """Indexes into ``texts``, ``batch_size`` at a time, longest texts first (ties keep input
    order).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def predict_in_length_order(
    predict: Callable[[list[str]], Sequence[T]],
    texts: Sequence[str],
    batch_size: int,
    on_batch: Callable[[int], object] | None = None,
) -> list[T]:
    """``predict`` over ``texts`` in length-sorted batches; results in the order of ``texts``."""
    out: list[T | None] = [None] * len(texts)
    for indexes in length_sorted_batches(texts, batch_size):
        results = predict([texts[i] for i in indexes])
        if len(results) != len(indexes):
            raise ValueError(f"predict returned {len(results)} results for {len(indexes)} texts")
        for i, result in zip(indexes, results):
            out[i] = result
        if on_batch is not None:
            on_batch(len(indexes))
    return out  # type: ignore[return-value]  # every index was filled
