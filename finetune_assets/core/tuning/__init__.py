"""Hyper-parameter studies (Optuna): the study, its storage, pruning and tags."""
