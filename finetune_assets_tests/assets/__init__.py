"""Tests of the assets one at a time: what each publishes and what Dagster records of it."""
