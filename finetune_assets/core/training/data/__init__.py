"""The trainer's input: MDS shards streamed, cached per node, collated into batches."""
