"""benchmark_scores: both models of a version on every registered benchmark set."""

from finetune_assets.defs.benchmarks.scores import benchmark_scores

__all__ = ["assets"]

assets = [benchmark_scores]
