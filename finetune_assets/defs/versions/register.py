"""Registering a dataset version: the dynamic partition plus where its reviews come from.

The sensor and the CLI both register through here, so a version always has a recorded source
(``{root}/versions/{key}.json``) that ``raw_reviews`` reads; re-registering the same source is a
no-op. A key names one content forever: a different source under a registered key is refused
(``replace`` only while nothing was materialized), concurrent registrations of one key are
serialized by a lock (``storage_files.file_lock``), and the content fingerprint recorded at
registration is checked again before every read (:func:`content_changed`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import dagster as dg

from finetune_assets.core.io.contracts import PARTITIONED_ASSETS
from finetune_assets.core.io.primitives import file_lock
from finetune_assets.core.io.storage import Storage
from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET, LabelError, LabelSet
from finetune_assets.core.sources import SourceSpec, is_file_source
from finetune_assets.defs.versions.landing import fingerprint
from finetune_assets.defs.versions.partitions import DATASET_VERSIONS, validate_version_key

LOCK_STALE_S = 120.0  # a lock older than this was left by a killed process
LOCK_WAIT_S = 30.0


class VersionConflict(ValueError):
    """A registration or removal that would change what a version key means."""


@dataclass(frozen=True)
class VersionRecord:
    key: str
    source: SourceSpec
    fingerprint: str | None = (
        None  # content hash of the source files at registration (sensor and CLI)
    )
    registered_at: float = 0.0
    labels: dict | None = (
        None  # LabelSet.to_dict(); None (records before label sets): the default three classes
    )

    @property
    def label_set(self) -> LabelSet | None:
        return LabelSet.from_dict(self.labels) if self.labels else None


def record_url(storage: Storage, key: str) -> str:
    return storage.url("versions", f"{validate_version_key(key)}.json")


def read_version(storage: Storage, key: str) -> VersionRecord | None:
    data = storage.read_json(record_url(storage, key))
    if data is None:
        return None
    return VersionRecord(
        key=data["key"],
        source=SourceSpec(**data["source"]),
        fingerprint=data.get("fingerprint"),
        registered_at=data.get("registered_at", 0.0),
        labels=data.get("labels"),
    )


def write_version(
    storage: Storage,
    key: str,
    source: SourceSpec,
    fingerprint: str | None = None,
    labels: LabelSet | None = None,
) -> VersionRecord:
    record = VersionRecord(
        key=validate_version_key(key),
        source=source,
        fingerprint=fingerprint,
        registered_at=time.time(),
        labels=labels.to_dict() if labels else None,
    )
    storage.write_atomic(record_url(storage, key), json.dumps(asdict(record), indent=2).encode())
    return record


def source_fingerprint(source: SourceSpec) -> str | None:
    """The content hash the sensor records too (None where the spec itself pins the content:
    built-in sets, Hugging Face ids, Delta versions, SQL content hashes).
    """
    if not is_file_source(source.uri):
        return None
    return fingerprint(source.uri)


def materialized_assets(
    storage: Storage, key: str, instance: dg.DagsterInstance | None = None
) -> list[str]:
    """Assets with something published (storage) or recorded (Dagster) for this version."""
    found = [a for a in PARTITIONED_ASSETS if storage.current(a, key) is not None]
    if instance is not None:
        for asset in PARTITIONED_ASSETS:
            if asset in found:
                continue
            target = dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[key])
            if instance.fetch_materializations(target, limit=1).records:
                found.append(asset)
    return found


@contextlib.contextmanager
def version_lock(storage: Storage, key: str) -> Iterator[None]:
    """One registration of ``key`` at a time (``storage_files.file_lock``, local or remote)."""
    url = storage.url("versions", f"{validate_version_key(key)}.lock")
    held = contextlib.ExitStack()
    try:
        held.enter_context(
            file_lock(url, fs=storage.fs, timeout_s=LOCK_WAIT_S, stale_s=LOCK_STALE_S)
        )
    except TimeoutError as err:
        raise VersionConflict(
            f"dataset version {key}: another registration holds {url}; retry once no other "
            "`finetune-assets versions` command runs"
        ) from err
    with held:
        yield


def record_landed(
    storage: Storage, key: str, spec: SourceSpec, fp: str | None, labels: LabelSet | None
) -> str | None:
    """Record a landed version's source under its lock, before its partition exists (so a visible
    partition always has a source); why not, when the CLI registered other content under the key
    meanwhile.
    """
    with version_lock(storage, key):
        record = read_version(storage, key)
        if record is not None and (record.source != spec or record.fingerprint != fp):
            return (
                f"dataset version {key} was registered meanwhile from {record.source.uri}; "
                "land the new data under a new key"
            )
        if record is None:
            write_version(storage, key, spec, fingerprint=fp, labels=labels)
    return None


def register_version(
    instance: dg.DagsterInstance,
    storage: Storage,
    key: str,
    source: SourceSpec,
    fingerprint: str | None = None,
    replace: bool = False,
    labels: LabelSet | None = None,
) -> VersionRecord:
    """Record the source, then add the partition (so a visible partition always has a source).

    The same source again is a no-op; a different one is refused unless ``replace`` and nothing of
    the version was materialized yet. The label set is part of the version: registering other labels
    under an existing key is refused.
    """
    validate_version_key(key)
    with version_lock(storage, key):
        existing = read_version(storage, key)
        before = (existing.label_set or DEFAULT_LABEL_SET) if existing is not None else None
        if before is not None and labels is not None and before != labels:
            raise LabelError(
                f"dataset version {key} is registered with labels {before.describe()}; "
                f"its labels cannot change to {labels.describe()}: register a new version key"
            )
        if (
            existing is not None
            and existing.source == source
            and (fingerprint is None or existing.fingerprint in (None, fingerprint))
        ):
            record = existing
        else:
            if existing is not None:
                _check_replace(instance, storage, key, existing, source, replace)
            if existing is not None and labels is None:
                labels = existing.label_set  # re-pointing a never-materialized key keeps its labels
            record = write_version(storage, key, source, fingerprint, labels)
    if not instance.has_dynamic_partition(DATASET_VERSIONS, key):
        instance.add_dynamic_partitions(DATASET_VERSIONS, [key])
    return record


def _check_replace(
    instance, storage: Storage, key: str, existing: VersionRecord, source: SourceSpec, replace: bool
) -> None:
    if existing.source == source:
        what = f"dataset version {key}: the content of {source.uri} changed since it was registered"
    else:
        what = (
            f"dataset version {key} is registered from {existing.source.uri}"
            + ("" if existing.source.uri != source.uri else " with other options")
            + f"; refusing {source.uri}"
        )
    done = materialized_assets(storage, key, instance)
    if done:
        raise VersionConflict(
            f"{what}: {', '.join(done)} already materialized from it, and a version key "
            "names one content forever; register the new data under a new key"
        )
    if not replace:
        raise VersionConflict(
            f"{what}: pass --replace to point the (never materialized) key at the new "
            "source, or use a new key"
        )


def remove_version(
    instance: dg.DagsterInstance, storage: Storage, key: str, force: bool = False
) -> list[str]:
    """Delete the partition and its record; refused while assets are materialized unless ``force``.

    Published files stay where they are (returned: the assets that had some); nothing is deleted
    from storage, so a forced removal can be undone by registering the same source again.
    """
    validate_version_key(key)
    with version_lock(storage, key):
        known = instance.has_dynamic_partition(DATASET_VERSIONS, key)
        if not known and read_version(storage, key) is None:
            raise VersionConflict(
                f"dataset version {key} is not registered (see `finetune-assets versions list`)"
            )
        done = materialized_assets(storage, key, instance)
        if done and not force:
            raise VersionConflict(
                f"dataset version {key} has materialized assets ({', '.join(done)}); "
                "pass --force to remove the registration anyway (published files are kept)"
            )
        if known:
            instance.delete_dynamic_partition(DATASET_VERSIONS, key)
        with contextlib.suppress(FileNotFoundError):
            storage.fs.rm(record_url(storage, key))
    return done


def content_changed(storage: Storage, key: str, source: SourceSpec) -> str | None:
    """Why reading ``source`` for ``key`` is refused (its content differs from the registered
    one), or None.
    """
    record = read_version(storage, key)
    if record is None or record.fingerprint is None or record.source.uri != source.uri:
        return None
    try:
        now = source_fingerprint(source)
    except (OSError, ValueError):
        return None  # unreadable: the reader names the problem
    if now is None or now == record.fingerprint:
        return None
    return (
        f"{source.uri}: content changed after dataset version {key} was registered (fingerprint "
        f"{record.fingerprint} -> {now}); versions are immutable: register the new content under "
        "a new key "
        f"(`finetune-assets versions add NEW_KEY --source {source.uri}`), restore the original "
        "files, or, if "
        f"nothing of {key} was materialized, re-register it with `versions add {key} --source "
        "... --replace`"
    )
