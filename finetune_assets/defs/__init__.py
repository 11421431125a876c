"""The Dagster side, one folder per feature (versions, data, models, promotion, benchmarks,
tuning), plus the resources, automation and jobs they share.
"""
