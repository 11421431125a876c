"""Typed handles on everything outside the process: storage, MLflow, training launchers."""
