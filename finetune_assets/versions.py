"""Registering a dataset version: the dynamic partition plus where its reviews come from.

The sensor and the CLI both register through here, so a version always has a recorded source
(``{root}/versions/{key}.json``) that ``raw_reviews`` reads; re-registering the same source is a no-op.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import dagster as dg

from finetune_assets.data.labels import DEFAULT_LABEL_SET, LabelError, LabelSet
from finetune_assets.data.sources import SourceSpec
from finetune_assets.partitions import DATASET_VERSIONS, validate_version_key
from finetune_assets.storage import Storage


@dataclass(frozen=True)
class VersionRecord:
    key: str
    source: SourceSpec
    fingerprint: str | None = None  # content hash of the drop, when known (sensor)
    registered_at: float = 0.0
    labels: dict | None = None  # LabelSet.to_dict(); None (records before label sets): the seed's classes

    @property
    def label_set(self) -> LabelSet | None:
        return LabelSet.from_dict(self.labels) if self.labels else None


def record_url(storage: Storage, key: str) -> str:
    return storage.url("versions", f"{validate_version_key(key)}.json")


def read_version(storage: Storage, key: str) -> VersionRecord | None:
    data = storage.read_json(record_url(storage, key))
    if data is None:
        return None
    return VersionRecord(key=data["key"], source=SourceSpec(**data["source"]),
                         fingerprint=data.get("fingerprint"), registered_at=data.get("registered_at", 0.0),
                         labels=data.get("labels"))


def write_version(storage: Storage, key: str, source: SourceSpec, fingerprint: str | None = None,
                  labels: LabelSet | None = None) -> VersionRecord:
    record = VersionRecord(key=validate_version_key(key), source=source, fingerprint=fingerprint,
                           registered_at=time.time(), labels=labels.to_dict() if labels else None)
    storage.write_atomic(record_url(storage, key), json.dumps(asdict(record), indent=2).encode())
    return record


def register_version(instance: dg.DagsterInstance, storage: Storage, key: str, source: SourceSpec,
                     fingerprint: str | None = None, labels: LabelSet | None = None) -> VersionRecord:
    """Record the source, then add the partition (so a visible partition always has a source).

    The label set is part of the version: registering other labels under an existing key is refused.
    """
    previous = read_version(storage, key)
    before = (previous.label_set or DEFAULT_LABEL_SET) if previous is not None else None
    if before is not None and labels is not None and before != labels:
        raise LabelError(f"dataset version {key} is registered with labels {before.describe()}; "
                         f"its labels cannot change to {labels.describe()}: register a new version key")
    if previous is not None and labels is None:
        labels = previous.label_set  # re-registering the source keeps the recorded labels
    record = write_version(storage, key, source, fingerprint, labels)
    if not instance.has_dynamic_partition(DATASET_VERSIONS, key):
        instance.add_dynamic_partitions(DATASET_VERSIONS, [key])
    return record
