"""Sensors that turn newly landed data into dataset versions and retraining runs."""

import dagster as dg

sensors: list[dg.SensorDefinition] = []
