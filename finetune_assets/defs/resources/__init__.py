"""Dagster resources shared by the features: the storage root, MLflow, the training launcher."""
