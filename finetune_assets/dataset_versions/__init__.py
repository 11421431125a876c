"""Dataset versions, the unit every data asset is partitioned by.

``keys`` (the key rule, Dagster-free: storage, pods and the CLI share it), ``partitions`` (the
Dagster dynamic partition) and ``registry`` (registering a version's source under the storage root).
Nothing is imported here, so ``keys`` stays importable without Dagster.
"""
