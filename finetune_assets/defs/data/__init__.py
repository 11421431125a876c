"""Data assets and their checks: raw_reviews, pretrained_model, tokenized_reviews, mds_shards."""
