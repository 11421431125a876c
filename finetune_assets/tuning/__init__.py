"""Hyper-parameter tuning of a dataset version: an Optuna study whose trials are real trainings."""
