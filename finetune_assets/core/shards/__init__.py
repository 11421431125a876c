"""MosaicML MDS shards: the writer, the slice plan and the slice workers that tokenize and shard in
parallel.
"""
