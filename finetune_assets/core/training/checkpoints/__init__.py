"""The trainer's files: checkpoints, the best model, fencing against a stale gang."""
