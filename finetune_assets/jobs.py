"""Jobs over the asset graph (full retrain per dataset version, retrain the model only)."""

import dagster as dg

jobs: list = []
