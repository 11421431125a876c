"""Pure data path (no Dagster): read and validate sources, tokenize, split, write shards, load
models.
"""
