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

A watched Delta table (``LandingZoneResource.delta_tables``) is followed by its commit history: each
row-adding commit (or each ``min_new_rows`` rows) registers ``{name}-v{table version}`` pinned
to it; optimize and vacuum commits add no rows and register nothing.

A problem with one entry (bad key, unsupported file, no data files, content changed after
registration, an unreadable drop) is logged once and listed in the skip reason; it never blocks the
other entries. A tick's work is bounded by ``LandingZoneResource.tick_budget_s``.
"""

import json
import time
from dataclasses import dataclass, field

import dagster as dg

from finetune_assets.core.io.contracts import TUNING_STUDY
from finetune_assets.core.labels.infer import LabelError, LabelSet, read_manifest
from finetune_assets.core.sources import (
    DELTA_PREFIX,
    SourceError,
    SourceSpec,
    check_source,
    list_files,
)
from finetune_assets.core.tuning.tags import AUTO_TUNE_TAG
from finetune_assets.defs.dagster_internals import WILL_RETRY_TAG
from finetune_assets.defs.jobs import RETRY_TAGS
from finetune_assets.defs.resources.storage_root import StorageResource
from finetune_assets.defs.tuning.on_landing import tuned_retrain_sensor
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
from finetune_assets.defs.versions.register import read_version, version_lock, write_version
from finetune_assets.defs.versions.run_outcome import STATUS_TAG, run_outcome

# 2: only what registration needs (1 also followed each version's runs); a cursor of 1 is read
CURSOR_VERSIONS = (1, 2)


@dataclass
class LandingCursor:
    """What the sensor remembers between ticks (JSON in the sensor cursor)."""

    registered: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> {fp, sig}
    pending: dict[str, str] = field(default_factory=dict)  # file key -> signature seen last tick
    reported: dict[str, str] = field(default_factory=dict)  # entry -> problem already logged
    tables: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> {seen, rows}

    @classmethod
    def parse(cls, raw: str | None) -> "LandingCursor":
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls()  # behaves like a reset cursor: existing partitions are never added again
        if data.get("v") not in CURSOR_VERSIONS:
            return cls()
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    def dumps(self) -> str:
        return json.dumps(
            {"v": CURSOR_VERSIONS[-1], **{k: getattr(self, k) for k in self.__dataclass_fields__}},
            sort_keys=True,
        )


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
    cursor = LandingCursor.parse(context.cursor)
    store = storage.storage()
    instance = context.instance
    started = clock()
    existing = set(instance.get_dynamic_partitions(DATASET_VERSIONS))
    entries = landing.list_entries()
    problems: dict[
        str, str
    ] = {}  # entry name -> why it was skipped (malformed / conflicting / unreadable)
    waiting: list[str] = []  # why complete-looking versions are not yet registered
    new_partitions: list[str] = []

    by_key: dict[str, list[LandedEntry]] = {}
    for e in entries:
        by_key.setdefault(e.key, []).append(e)
    seen_keys = set(by_key)
    deferred = 0

    for key, group in sorted(by_key.items()):
        prev = cursor.registered.get(key)
        if len(group) == 1 and prev is not None and prev["sig"] == group[0].signature:
            continue  # registered, unchanged: the common case, no I/O beyond the listing
        if clock() - started > landing.tick_budget_s:
            deferred += 1
            continue
        e = group[0]
        try:
            _consider(
                landing,
                store,
                cursor,
                existing,
                key,
                group,
                problems,
                waiting,
                new_partitions,
            )
        # an unreadable drop (deleted mid-read, permissions) is its own problem
        except Exception as err:
            problems[e.name] = f"could not read it ({type(err).__name__}: {err}); retried next tick"

    for watched in landing.delta_tables:
        if clock() - started > landing.tick_budget_s:
            deferred += 1
            continue
        try:
            _consider_table(store, cursor, existing, watched, problems, new_partitions)
        except Exception as err:  # an unreachable table is its own problem
            why = f"could not read it ({type(err).__name__}: {err}); retried next tick"
            problems[DELTA_PREFIX + watched.table] = why

    # Files that vanished before they settled are forgotten; reports clear when the entry is fixed.
    cursor.pending = {k: v for k, v in cursor.pending.items() if k in seen_keys}
    if deferred:
        waiting.append(
            f"{deferred} entries left for the next tick (tick budget {landing.tick_budget_s:g} s)"
        )

    _log_problems(context, cursor, problems)

    dpr = (
        [dg.AddDynamicPartitionsRequest(DATASET_VERSIONS, new_partitions)] if new_partitions else []
    )
    if dpr:
        for key in new_partitions:
            context.log.info(
                f"registered dataset version {key} (fingerprint {cursor.registered[key]['fp']})"
            )
        return dg.SensorResult(dynamic_partitions_requests=dpr, cursor=cursor.dumps())
    reasons = [*(f"{name}: {why}" for name, why in sorted(problems.items())), *waiting]
    skip = "; ".join(reasons) if reasons else f"no new dataset versions in {landing.location()}"
    return dg.SensorResult(skip_reason=dg.SkipReason(skip), cursor=cursor.dumps())


def _consider(
    landing,
    store,
    cursor: LandingCursor,
    existing,
    key,
    group,
    problems,
    waiting,
    new_partitions,
) -> None:
    """One landed entry: register it as a version, wait for it, or say why it is skipped."""
    if len(group) > 1:
        names = ", ".join(e.name for e in group)
        for e in group:
            problems[e.name] = (
                f"version key {key!r} is ambiguous ({names}): keep one, rename the others"
            )
        return
    e = group[0]
    if not e.is_dir and strip_format_suffix(e.name) is None:
        problems[e.name] = (
            "unsupported file type (use .csv, .tsv, .jsonl, .json or .parquet, or a folder)"
        )
        return
    try:
        validate_version_key(key)
    except InvalidVersionKey as err:
        problems[e.name] = str(err)
        return
    prev = cursor.registered.get(key)
    if e.is_dir and prev is None and not landing.marker_present(e):
        waiting.append(f"{e.name}: waiting for {landing.success_marker}")
        return
    if not e.is_dir and prev is None and cursor.pending.get(key) != e.signature:
        cursor.pending[key] = e.signature
        waiting.append(f"{e.name}: waiting one tick for its size and mtime to stop changing")
        return
    cursor.pending.pop(key, None)
    if e.is_dir:
        try:
            list_files(e.uri)
        except SourceError as err:
            problems[e.name] = str(err)
            return
    fp = fingerprint(e.uri)
    if prev is not None:
        if prev["fp"] != fp:
            problems[e.name] = (
                f"content changed after version {key} was registered (fingerprint "
                f"{prev['fp']} -> {fp}); versions are immutable: land it under a new key"
            )
        prev["sig"] = e.signature
        return
    if key in existing:  # cursor reset, or registered by the CLI
        record = read_version(store, key)
        if record is not None and record.fingerprint == fp:
            # Same key and content as before: nothing to do (automation follows the partition)
            cursor.registered[key] = {"fp": fp, "sig": e.signature}
        else:
            problems[e.name] = (
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
        problems[e.name] = str(err)
        return
    why = _register(store, key, SourceSpec(uri=e.uri), fp, labels)
    if why:
        problems[e.name] = why
        return
    cursor.registered[key] = {"fp": fp, "sig": e.signature}
    new_partitions.append(key)


def _consider_table(
    store,
    cursor: LandingCursor,
    existing,
    watched: WatchedDeltaTable,
    problems,
    new_partitions,
) -> None:
    """A watched Delta table: a version per row-adding commit (or ``min_new_rows``), pinned."""
    from finetune_assets.core.sources.tables.delta import VersionGone
    from finetune_assets.core.sources.tables.delta_commits import due_versions

    state = cursor.tables.get(watched.name, {})
    notes: list[str] = []  # in-place deletes / updates on a table without change data feed
    due, seen, rows = due_versions(
        watched.table, state.get("seen"), state.get("rows", 0), watched.min_new_rows, notes=notes
    )
    for note in notes:  # "<uri>@version=N (OPERATION): why": reported once, at the tick that saw it
        where, why = note.split(" ", 1)
        problems[where] = why
    labels = LabelSet(tuple(watched.labels)) if watched.labels else None
    for version in due:
        key, fp = f"{watched.name}-v{version}", f"delta-v{version}"
        if key in existing:  # cursor reset, or registered by the CLI
            continue
        spec = SourceSpec(
            uri=f"{DELTA_PREFIX}{watched.table}@version={version}",
            text_column=watched.text_column,
            label_column=watched.label_column,
            where=watched.where,
        )
        try:
            validate_version_key(key)
            check_source(spec)
        except VersionGone as err:  # vacuumed before this tick saw it; later ones may be readable
            problems[f"{DELTA_PREFIX}{watched.table}@version={version}"] = str(err)
            continue
        except (InvalidVersionKey, SourceError) as err:
            problems[DELTA_PREFIX + watched.table] = str(err)
            return  # the cursor stays: the same versions are tried again once the config is fixed
        why = _register(store, key, spec, None, labels)
        if why:
            problems[DELTA_PREFIX + watched.table] = why
            return
        cursor.registered[key] = {"fp": fp, "sig": ""}
        new_partitions.append(key)
    cursor.tables[watched.name] = {"seen": seen, "rows": rows}


def _register(store, key: str, spec: SourceSpec, fp: str | None, labels) -> str | None:
    """Record the version's source under its lock, before its partition exists (so a visible
    partition always has a source); why not, when the CLI registered other content under the key
    meanwhile.
    """
    with version_lock(store, key):
        record = read_version(store, key)
        if record is not None and (record.source != spec or record.fingerprint != fp):
            return (
                f"dataset version {key} was registered meanwhile from {record.source.uri}; "
                "land the new data under a new key"
            )
        if record is None:
            write_version(store, key, spec, fingerprint=fp, labels=labels)
    return None


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


@dg.run_failure_sensor(
    name="version_outcome_sensor",
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="A failed run of a version -> tagged with what ended it (refused by the quality "
    "gate, refused by a blocking data check, or the failed step), in the run list.",
)
def version_outcome_sensor(context: dg.RunFailureSensorContext) -> None:
    run = context.dagster_run
    if run.tags.get(WILL_RETRY_TAG) == "true":
        return  # the daemon re-launches it; its retry reports
    why = run_outcome(context.instance, run)
    context.instance.add_run_tags(run.run_id, {STATUS_TAG: why[:255]})
    version = run.tags.get("dagster/partition", "?")
    context.log.warning(f"dataset version {version}: {why}")


def build_sensors(tune_new_versions: bool = False) -> list[dg.SensorDefinition]:
    """The landing sensor (registration only), the automation that builds every version
    (``defs/automation.py``) and the outcome tags; where new versions are tuned, the studies by an
    automation sensor of their own (its runs tagged as the sensor's, ``defs/tuning/on_landing.py``)
    and
    the winner's training after each.
    """
    everything = dg.AssetSelection.all()
    sensors = [landing_zone_sensor, version_outcome_sensor]
    if tune_new_versions:
        study = dg.AssetSelection.assets(TUNING_STUDY)
        everything = everything - study
        sensors += [
            dg.AutomationConditionSensorDefinition(
                "tuning_automation",
                target=study,
                run_tags={**RETRY_TAGS, AUTO_TUNE_TAG: "true"},
                emit_backfills=False,
                default_status=dg.DefaultSensorStatus.RUNNING,
                description="tuning_study[v] for each new version, after its data run.",
            ),
            tuned_retrain_sensor,
        ]
    sensors.append(
        dg.AutomationConditionSensorDefinition(
            "version_automation",
            target=everything,
            # one run per version and step of the chain (a backfill would pool versions)
            emit_backfills=False,
            run_tags=RETRY_TAGS,
            default_status=dg.DefaultSensorStatus.RUNNING,
            description="Each version's data preparation, then its training, gate, promotion "
            "and benchmark scores, by the assets' automation conditions (defs/automation.py).",
        )
    )
    return sensors
