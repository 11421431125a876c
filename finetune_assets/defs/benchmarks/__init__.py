"""benchmark_scores: both models of a version on every registered benchmark set."""
