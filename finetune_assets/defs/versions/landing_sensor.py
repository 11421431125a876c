"""Sensors: new landed data becomes dataset versions; automation builds them.

``landing_zone_sensor`` watches :class:`LandingZoneResource` and, for each new *complete* version
(folder with ``_SUCCESS``, or a file unchanged since the previous tick), records its source with
``write_version`` under the version's lock (before any run can read it) and adds the partition
through ``dynamic_partitions_requests``. It requests no run: ``version_automation`` (the assets'
automation conditions, ``defs/automation.py``) prepares, trains, gates, promotes and scores each new
partition, and ``version_outcome_sensor`` tags a failed run with what ended it.

Idempotence, in layers:

- the cursor (returned in ``SensorResult`` only, never ``update_cursor``) remembers each registered
  version with its listing signature, so repeated ticks do no work;
- a version already present as a partition (cursor lost, or registered by the CLI) is never added
  again; other content under a key already recorded is refused by name;
- a run's end is never followed here: automation requests an asset once per trigger, so a failed or
  cancelled run is not requested again; Dagster's run retries are the one retry layer.

A watched Delta table (``LandingZoneResource.delta_tables``) is followed by its commit history
(:mod:`.delta_tables`): each row-adding commit (or each ``min_new_rows`` rows) registers
``{name}-v{table version}`` pinned to it.

A problem with one entry (bad key, unsupported file, no data files, content changed after
registration, an unreadable drop) is logged once and listed in the skip reason; it never blocks the
other entries. A tick's work is bounded by ``LandingZoneResource.tick_budget_s``.
"""

import functools
import time
from dataclasses import dataclass, field

import dagster as dg

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.labels.infer import LabelError, read_manifest
from finetune_assets.core.sources import DELTA_PREFIX, SourceError, SourceSpec, list_files
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.versions.cursor import LandingCursor
from finetune_assets.defs.versions.delta_tables import consider_table
from finetune_assets.defs.versions.landing import (
    LandedEntry,
    LandingZoneResource,
    WatchedDeltaTable,
    fingerprint,
    strip_format_suffix,
)
from finetune_assets.defs.versions.partitions import (
    DATASET_VERSIONS,
    InvalidVersionKey,
    validate_version_key,
)
from finetune_assets.defs.versions.register import read_version, record_landed

__all__ = ["LandingCursor", "evaluate_landing", "landing_zone_sensor"]


def evaluate_landing(
    context: dg.SensorEvaluationContext,
    landing: LandingZoneResource,
    storage: StorageResource,
    clock=time.monotonic,
) -> dg.SensorResult:
    """One tick; a plain function so tests and the sensor share it.

    Work is bounded: one listing, then per-entry work only for entries not yet registered, stopping
    once ``landing.tick_budget_s`` is spent (``clock`` is injectable for tests); what was done is in
    the returned cursor and the next tick goes on from there. One entry's error never stops the
    others.
    """
    cursor, store = LandingCursor.parse(context.cursor), storage.storage()
    started = clock()
    existing = set(context.instance.get_dynamic_partitions(DATASET_VERSIONS))
    tick = _Tick(landing, store, cursor, existing)
    by_key: dict[str, list[LandedEntry]] = {}
    for e in landing.list_entries():
        by_key.setdefault(e.key, []).append(e)
    # (what a failure is reported under, the work): new or changed entries, then the tables
    work = [
        (group[0].name, functools.partial(_consider, tick, key, group))
        for key, group in sorted(by_key.items())
        if not _unchanged(cursor, key, group)
    ] + [(DELTA_PREFIX + w.table, functools.partial(tick.follow, w)) for w in landing.delta_tables]
    deferred = 0
    for name, step in work:
        if clock() - started > landing.tick_budget_s:
            deferred += 1
            continue
        try:
            step()
        # an unreadable drop (deleted mid-read, permissions) or table is its own problem
        except Exception as err:
            why = f"could not read it ({type(err).__name__}: {err}); retried next tick"
            tick.problems[name] = why

    # Files that vanished before they settled are forgotten; reports clear when the entry is fixed.
    cursor.pending = {k: v for k, v in cursor.pending.items() if k in by_key}
    if deferred:
        tick.waiting.append(
            f"{deferred} entries left for the next tick (tick budget {landing.tick_budget_s:g} s)"
        )
    _log_problems(context, cursor, tick.problems)
    return tick.result(context)


@dataclass
class _Tick:
    """One tick's work: what it found, registered, skipped (and why) and waits for."""

    landing: LandingZoneResource
    store: Storage
    cursor: LandingCursor
    existing: set[str]  # the partitions there when the tick started
    # entry name -> why it was skipped (malformed / conflicting / unreadable)
    problems: dict[str, str] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)  # why complete-looking versions wait
    new_partitions: list[str] = field(default_factory=list)

    def follow(self, watched: WatchedDeltaTable) -> None:
        consider_table(
            self.store, self.cursor, self.existing, watched, self.problems, self.new_partitions
        )

    def result(self, context: dg.SensorEvaluationContext) -> dg.SensorResult:
        """The new partitions, or why there are none; the cursor either way."""
        if self.new_partitions:
            for key in self.new_partitions:
                fp = self.cursor.registered[key]["fp"]
                context.log.info(f"registered dataset version {key} (fingerprint {fp})")
            return dg.SensorResult(
                dynamic_partitions_requests=[
                    dg.AddDynamicPartitionsRequest(DATASET_VERSIONS, self.new_partitions)
                ],
                cursor=self.cursor.dumps(),
            )
        reasons = [*(f"{n}: {why}" for n, why in sorted(self.problems.items())), *self.waiting]
        skip = "; ".join(reasons) or f"no new dataset versions in {self.landing.location()}"
        return dg.SensorResult(skip_reason=dg.SkipReason(skip), cursor=self.cursor.dumps())


def _unchanged(cursor: LandingCursor, key: str, group: list[LandedEntry]) -> bool:
    """Registered and unchanged: the common case, no I/O beyond the listing."""
    prev = cursor.registered.get(key)
    return len(group) == 1 and prev is not None and prev["sig"] == group[0].signature


def _consider(tick: _Tick, key: str, group: list[LandedEntry]) -> None:
    """One landed entry: register it as a version, wait for it, or say why it is skipped."""
    malformed = _malformed(key, group)
    if malformed:
        tick.problems.update(malformed)
        return
    e = group[0]
    prev = tick.cursor.registered.get(key)
    if prev is None and not _settled(tick.landing, tick.cursor, key, e, tick.waiting):
        return
    tick.cursor.pending.pop(key, None)
    if e.is_dir:
        try:
            list_files(e.uri)
        except SourceError as err:
            tick.problems[e.name] = str(err)
            return
    fp = fingerprint(e.uri)
    if prev is not None:
        if prev["fp"] != fp:
            tick.problems[e.name] = (
                f"content changed after version {key} was registered (fingerprint "
                f"{prev['fp']} -> {fp}); versions are immutable: land it under a new key"
            )
        prev["sig"] = e.signature
        return
    if key in tick.existing:  # cursor reset, or registered by the CLI
        record = read_version(tick.store, key)
        if record is not None and record.fingerprint == fp:
            # Same key and content as before: nothing to do (automation follows the partition)
            tick.cursor.registered[key] = {"fp": fp, "sig": e.signature}
        else:
            tick.problems[e.name] = (
                f"dataset version {key} is already registered from "
                f"{record.source.uri if record else 'an unknown source'}; "
                "land the new data under a new key"
            )
        return
    # a folder drop may carry its label set (core/labels/infer.py MANIFEST); else the default
    # classes
    try:
        labels = read_manifest(e.uri) if e.is_dir else None
    except LabelError as err:
        tick.problems[e.name] = str(err)
        return
    why = record_landed(tick.store, key, SourceSpec(uri=e.uri), fp, labels)
    if why:
        tick.problems[e.name] = why
        return
    tick.cursor.registered[key] = {"fp": fp, "sig": e.signature}
    tick.new_partitions.append(key)


def _malformed(key: str, group: list[LandedEntry]) -> dict[str, str]:
    """Why the entries under ``key`` cannot be a version (entry name -> why); empty if they can."""
    if len(group) > 1:
        names = ", ".join(e.name for e in group)
        why = f"version key {key!r} is ambiguous ({names}): keep one, rename the others"
        return {e.name: why for e in group}
    e = group[0]
    if not e.is_dir and strip_format_suffix(e.name) is None:
        return {
            e.name: "unsupported file type (use .csv, .tsv, .jsonl, .json or .parquet, or a folder)"
        }
    try:
        validate_version_key(key)
    except InvalidVersionKey as err:
        return {e.name: str(err)}
    return {}


def _settled(
    landing: LandingZoneResource, cursor: LandingCursor, key: str, e: LandedEntry, waiting: list
) -> bool:
    """Whether a new entry is completely written: a folder's marker is there, a file is unchanged
    since the previous tick (else why it waits, in ``waiting``).
    """
    if e.is_dir and not landing.marker_present(e):
        waiting.append(f"{e.name}: waiting for {landing.success_marker}")
        return False
    if not e.is_dir and cursor.pending.get(key) != e.signature:
        cursor.pending[key] = e.signature
        waiting.append(f"{e.name}: waiting one tick for its size and mtime to stop changing")
        return False
    return True


def _log_problems(context, cursor: LandingCursor, problems: dict[str, str]) -> None:
    for name, why in sorted(problems.items()):
        if cursor.reported.get(name) != why:
            context.log.warning(f"skipping {name}: {why}")
    cursor.reported = dict(problems)


@dg.sensor(
    name="landing_zone_sensor",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "New data in the landing zone -> a dataset version (its record and partition); "
        "version_automation then prepares, trains, gates and promotes it."
    ),
)
def landing_zone_sensor(
    context: dg.SensorEvaluationContext, landing: LandingZoneResource, storage: StorageResource
) -> dg.SensorResult:
    return evaluate_landing(context, landing, storage)
