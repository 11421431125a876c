"""Sensors that turn newly landed data into dataset versions and retraining runs.

``landing_zone_sensor`` watches :class:`LandingZoneResource` and, for each new *complete* version
(folder with ``_SUCCESS``, or a file unchanged since the previous tick), records its source with
``write_version`` (before any run can read it), adds the partition through
``dynamic_partitions_requests`` and requests its runs (``version_runs.py``: data preparation,
then training once the data is ready).

Idempotence, in layers:

- the cursor (returned in ``SensorResult`` only, never ``update_cursor``) remembers each registered
  version with its listing signature, so repeated ticks do no work and request nothing;
- a version already present as a partition (cursor lost, or registered by the CLI) is never added
  again;
- every run key is ``{version}:{fingerprint}`` (names, sizes, mtimes from the listing): the daemon
  drops a request whose key it has seen, so even a lost cursor cannot start a duplicate run, while a
  deleted version re-landed with *different* content still runs (Dagster's run-key dedup is
  permanent);
- a run's end is reported, never re-run by the sensor (``version_runs.follow_runs``): Dagster's run
  retries are the one retry layer; only a request that never became a run is requested again.

A watched Delta table (``LandingZoneResource.delta_tables``) is followed by its commit history: each
row-adding commit (or each ``min_new_rows`` rows) registers ``{name}-v{table version}`` pinned
to it, under the same run-request rules; optimize and vacuum commits add no rows and register
nothing.

A problem with one entry (bad key, unsupported file, no data files, content changed after
registration, an unreadable drop) is logged once and listed in the skip reason; it never blocks the
other entries. A tick's work is bounded by ``LandingZoneResource.tick_budget_s``.
"""

import time

import dagster as dg

from finetune_assets.data.labels import LabelError, LabelSet, read_manifest
from finetune_assets.data.sources import (
    DELTA_PREFIX,
    SourceError,
    SourceSpec,
    check_source,
    list_files,
)
from finetune_assets.dataset_versions.partitions import (
    DATASET_VERSIONS,
    InvalidVersionKey,
    validate_version_key,
)
from finetune_assets.dataset_versions.registry import read_version, write_version
from finetune_assets.jobs import retrain_job
from finetune_assets.resources.landing import (
    LandedEntry,
    LandingZoneResource,
    WatchedDeltaTable,
    fingerprint,
    strip_format_suffix,
)
from finetune_assets.resources.storage_root import StorageResource
from finetune_assets.tuning import on_landing
from finetune_assets.version_runs import (  # noqa: F401 - re-exported: the sensor's public names
    LOST_AFTER_S,
    MAX_RUN_ATTEMPTS,
    PHASE_TAG,
    STATUS_TAG,
    VERSION_TAG,
    LandingCursor,
    follow_runs,
    requests_with_base,
    retrain_request,
    run_key,
    run_outcome,
    track,
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
    ready: list[tuple[str, str, str]] = []  # (key, fp, source) whose runs to request this tick
    rerequest: list[dg.RunRequest] = []

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
                ready,
                rerequest,
            )
        # an unreadable drop (deleted mid-read, permissions) is its own problem
        except Exception as err:  # noqa: BLE001
            problems[e.name] = f"could not read it ({type(err).__name__}: {err}); retried next tick"

    for watched in landing.delta_tables:
        if clock() - started > landing.tick_budget_s:
            deferred += 1
            continue
        try:
            _consider_table(store, cursor, existing, watched, problems, new_partitions, ready)
        except Exception as err:  # noqa: BLE001 - an unreachable table is its own problem
            why = f"could not read it ({type(err).__name__}: {err}); retried next tick"
            problems[DELTA_PREFIX + watched.table] = why

    # Files that vanished before they settled are forgotten; reports clear when the entry is fixed.
    cursor.pending = {k: v for k, v in cursor.pending.items() if k in seen_keys}
    if deferred:
        waiting.append(
            f"{deferred} entries left for the next tick (tick budget {landing.tick_budget_s:g} s)"
        )

    run_requests = on_landing.route(  # a version's training run, or its study when tuning
        follow_runs(context, cursor, store)
        + requests_with_base(cursor, store, ready, waiting)
        + rerequest,
        landing.tune_new_versions,
    )
    _log_problems(context, cursor, problems)

    dpr = (
        [dg.AddDynamicPartitionsRequest(DATASET_VERSIONS, new_partitions)] if new_partitions else []
    )
    if run_requests or dpr:
        for key in new_partitions:
            context.log.info(
                f"registered dataset version {key} (fingerprint {cursor.registered[key]['fp']})"
            )
        return dg.SensorResult(
            run_requests=run_requests, dynamic_partitions_requests=dpr, cursor=cursor.dumps()
        )
    reasons = [
        *(f"{name}: {why}" for name, why in sorted(problems.items())),
        *waiting,
        *(f"{key}: {why}" for key, why in sorted(cursor.failed.items())),
    ]
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
    ready,
    rerequest,
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
            cursor.registered[key] = {"fp": fp, "sig": e.signature}
            # Same key and content as before: the daemon drops this by run key if it already ran.
            rerequest.append(track(cursor, key, fp, e.uri, with_base=False))
        else:
            problems[e.name] = (
                f"dataset version {key} is already registered from "
                f"{record.source.uri if record else 'an unknown source'}; "
                "land the new data under a new key"
            )
        return
    try:  # a folder drop may carry its label set (data/labels.py MANIFEST); else the seed's classes
        labels = read_manifest(e.uri) if e.is_dir else None
    except LabelError as err:
        problems[e.name] = str(err)
        return
    # before the run can start
    write_version(store, key, SourceSpec(uri=e.uri), fingerprint=fp, labels=labels)
    cursor.registered[key] = {"fp": fp, "sig": e.signature}
    new_partitions.append(key)
    ready.append((key, fp, e.uri))


def _consider_table(
    store,
    cursor: LandingCursor,
    existing,
    watched: WatchedDeltaTable,
    problems,
    new_partitions,
    ready,
) -> None:
    """A watched Delta table: a version per row-adding commit (or ``min_new_rows``), pinned."""
    from finetune_assets.data.sources.delta import VersionGone
    from finetune_assets.data.sources.delta_commits import due_versions

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
        write_version(store, key, spec, labels=labels)  # before the run can start
        cursor.registered[key] = {"fp": fp, "sig": ""}
        new_partitions.append(key)
        ready.append((key, fp, spec.uri))
    cursor.tables[watched.name] = {"seen": seen, "rows": rows}


def _log_problems(context, cursor: LandingCursor, problems: dict[str, str]) -> None:
    for name, why in sorted(problems.items()):
        if cursor.reported.get(name) != why:
            context.log.warning(f"skipping {name}: {why}")
    cursor.reported = dict(problems)


@dg.sensor(
    name="landing_zone_sensor",
    jobs=[retrain_job, on_landing.tune_job],
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "New data in the landing zone -> a dataset version (partition), its data-preparation run, "
        "then its training run."
    ),
)
def landing_zone_sensor(
    context: dg.SensorEvaluationContext, landing: LandingZoneResource, storage: StorageResource
) -> dg.SensorResult:
    return evaluate_landing(context, landing, storage)


benchmark_automation = dg.AutomationConditionSensorDefinition(
    "benchmark_automation",
    target=dg.AssetSelection.assets("benchmark_scores"),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Materializes benchmark_scores[v] by its automation condition (eager).",
)

sensors: list[dg.SensorDefinition] = [
    landing_zone_sensor,
    on_landing.tuned_retrain_sensor,
    benchmark_automation,
]
