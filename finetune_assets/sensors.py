"""Sensors that turn newly landed data into dataset versions and retraining runs.

``landing_zone_sensor`` watches :class:`LandingZoneResource` and, for each new *complete* version
(folder with ``_SUCCESS``, or a file unchanged since the previous tick), records its source with
``write_version`` (before any run can read it), adds the partition through
``dynamic_partitions_requests`` and requests ``retrain_job`` for it.

Idempotence, in layers:

- the cursor (returned in ``SensorResult`` only, never ``update_cursor``) remembers each registered
  version with its listing signature, so repeated ticks do no work and request nothing;
- a version already present as a partition (cursor lost, or registered by the CLI) is never added again;
- every run key is ``{version}:{fingerprint}`` (names, sizes, mtimes from the listing): the daemon drops
  a request whose key it has seen, so even a lost cursor cannot start a duplicate run, while a deleted
  version re-landed with *different* content still runs (Dagster's run-key dedup is permanent);
- a run's end is reported, never re-run by the sensor (``_follow_runs``): Dagster's run retries are the
  one retry layer; only a request that never became a run is requested again.

A watched Delta table (``LandingZoneResource.delta_tables``) is followed by its commit history: each
row-adding commit (or each ``min_new_rows`` rows) registers ``{name}-v{table version}`` pinned
to it, under the same run-request rules; optimize and vacuum commits add no rows and register
nothing.

A problem with one entry (bad key, unsupported file, no data files, content changed after
registration, an unreadable drop) is logged once and listed in the skip reason; it never blocks the
other entries. A tick's work is bounded by ``LandingZoneResource.tick_budget_s``.
"""

import json
import time
from dataclasses import dataclass, field

import dagster as dg
from dagster._core.storage.tags import WILL_RETRY_TAG

from finetune_assets.contracts import PRETRAINED_MODEL
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
from finetune_assets.jobs import VERSION_CHAIN, pretrained_model, retrain_job
from finetune_assets.resources.landing import (
    LandedEntry,
    LandingZoneResource,
    WatchedDeltaTable,
    fingerprint,
    strip_format_suffix,
)
from finetune_assets.resources.storage_root import StorageResource
from finetune_assets.tuning import on_landing

CURSOR_VERSION = 1
RUN_KEY_TAG = "dagster/run_key"
VERSION_TAG = "finetune_assets/dataset_version"
FINGERPRINT_TAG = "finetune_assets/fingerprint"
SOURCE_TAG = "finetune_assets/source"
ATTEMPT_TAG = "finetune_assets/attempt"
STATUS_TAG = (
    "finetune_assets/version_status"  # on a run the sensor gave up on: visible in the UI's run list
)
MAX_RUN_ATTEMPTS = 3  # requests per version that never became a run before leaving it to a person
LOST_AFTER_S = (
    600.0  # a requested run that never appeared by then (dropped request) is requested again
)


@dataclass
class LandingCursor:
    """What the sensor remembers between ticks (JSON in the sensor cursor)."""

    registered: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> {fp, sig}
    pending: dict[str, str] = field(default_factory=dict)  # file key -> signature seen last tick
    awaiting_base: dict[str, str] = field(
        default_factory=dict
    )  # key -> fp: run waits for pretrained_model
    base_run_key: str | None = None  # the run that builds pretrained_model, while it is unpublished
    reported: dict[str, str] = field(default_factory=dict)  # entry -> problem already logged
    runs: dict[str, dict] = field(
        default_factory=dict
    )  # key -> {fp, attempt, at}: requested, not yet succeeded
    failed: dict[str, str] = field(
        default_factory=dict
    )  # key -> why its run is given up (a person re-runs it)
    tables: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> {seen, rows}

    @classmethod
    def parse(cls, raw: str | None) -> "LandingCursor":
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return (
                cls()
            )  # an unreadable cursor behaves like a reset one: partitions + run keys still dedupe
        if data.get("v") != CURSOR_VERSION:
            return cls()
        return cls(
            registered=data.get("registered", {}),
            pending=data.get("pending", {}),
            awaiting_base=data.get("awaiting_base", {}),
            base_run_key=data.get("base_run_key"),
            reported=data.get("reported", {}),
            runs=data.get("runs", {}),
            failed=data.get("failed", {}),
            tables=data.get("tables", {}),
        )

    def dumps(self) -> str:
        return json.dumps(
            {
                "v": CURSOR_VERSION,
                "registered": self.registered,
                "pending": self.pending,
                "awaiting_base": self.awaiting_base,
                "base_run_key": self.base_run_key,
                "reported": self.reported,
                "runs": self.runs,
                "failed": self.failed,
                "tables": self.tables,
            },
            sort_keys=True,
        )


def run_key(key: str, fp: str, attempt: int = 1) -> str:
    """``{key}:{fp}`` for the first run of a version; a re-request after a failure adds ``:{attempt}``
    (the daemon drops a run key it has seen, whatever that run's outcome).
    """
    return f"{key}:{fp}" if attempt <= 1 else f"{key}:{fp}:{attempt}"


def retrain_request(
    key: str, fp: str, source: str, with_base: bool, attempt: int = 1
) -> dg.RunRequest:
    """One retrain run for a version; ``pretrained_model`` only while it has never been published."""
    assets = [*VERSION_CHAIN, *((pretrained_model,) if with_base else ())]
    return dg.RunRequest(
        run_key=run_key(key, fp, attempt),
        partition_key=key,
        asset_selection=[a.key for a in assets],
        tags={
            VERSION_TAG: key,
            FINGERPRINT_TAG: fp,
            SOURCE_TAG: source[-255:],
            ATTEMPT_TAG: str(attempt),
        },
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
    the returned cursor and the next tick goes on from there. One entry's error never stops the others.
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
        except Exception as err:  # noqa: BLE001 - an unreadable drop (deleted mid-read, permissions) is its own problem
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

    run_requests = on_landing.route(  # retrain_job, or tune_job when the deployment tunes
        _follow_runs(context, cursor, store)
        + _requests_with_base(cursor, store, ready, waiting)
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
            rerequest.append(retrain_request(key, fp, e.uri, with_base=False))
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
    write_version(
        store, key, SourceSpec(uri=e.uri), fingerprint=fp, labels=labels
    )  # before the run can start
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
    due, seen, rows = due_versions(
        watched.table, state.get("seen"), state.get("rows", 0), watched.min_new_rows
    )
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


def _requests_with_base(cursor: LandingCursor, store, ready, waiting) -> list[dg.RunRequest]:
    """Run requests for ready versions; only one run at a time builds a missing ``pretrained_model``.

    Every version shares the base model: two runs publishing it concurrently would race, so while it
    is unpublished one version's run builds it (``base_run_key`` names that version) and the others wait
    in the cursor. When that run is given up (``_follow_runs``), the next waiting version builds it.
    """
    queue = list(ready)
    for key, fp in list(cursor.awaiting_base.items()):
        record = read_version(store, key)
        queue.insert(0, (key, fp, record.source.uri if record else ""))
    if store.current(PRETRAINED_MODEL) is not None:
        cursor.awaiting_base, cursor.base_run_key = {}, None
        return [_track(cursor, k, fp, src, with_base=False) for k, fp, src in queue]
    requests = []
    if queue and cursor.base_run_key not in cursor.runs:
        key, fp, src = queue.pop(0)
        requests.append(_track(cursor, key, fp, src, with_base=True))
        cursor.base_run_key = key
        cursor.awaiting_base.pop(key, None)
    for key, fp, _ in queue:
        cursor.awaiting_base[key] = fp
        waiting.append(
            f"{key}: registered; its run waits until pretrained_model is built "
            f"(by the run of {cursor.base_run_key})"
        )
    return requests


def _track(
    cursor: LandingCursor, key: str, fp: str, source: str, with_base: bool, attempt: int = 1
) -> dg.RunRequest:
    cursor.runs[key] = {"fp": fp, "attempt": attempt, "at": time.time()}
    return retrain_request(key, fp, source, with_base=with_base, attempt=attempt)


def _follow_runs(context, cursor: LandingCursor, store) -> list[dg.RunRequest]:
    """Follow each version's run to its end and say how it ended; never re-run what ended.

    One retry layer, Dagster's: the daemon's run retries (``dagster/max_retries`` on the jobs)
    re-run an infrastructure failure from the failed step, and a step ``RetryPolicy`` covers
    transient registry errors. So a run the daemon will retry is waited for; a finished run is
    reported as what it was (cancelled by a person, refused by the gate, failed at a step) and left
    to a person, tagged and listed in the skip reason. Only a request that never became a run
    (``LOST_AFTER_S``) is requested again, at most ``MAX_RUN_ATTEMPTS`` times. One run-storage
    query per tick for all versions in flight.
    """
    instance = context.instance
    requests = []
    wanted = {run_key(key, info["fp"], info["attempt"]): key for key, info in cursor.runs.items()}
    latest: dict[str, dg.DagsterRun] = {}
    if wanted:
        # Newest first: a run the daemon retried (same tags) shadows the run it retried.
        for r in instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: list(wanted)})):
            latest.setdefault(r.tags.get(RUN_KEY_TAG), r)
    for key, info in sorted(cursor.runs.items()):
        run = latest.get(run_key(key, info["fp"], info["attempt"]))
        if run is None:
            if time.time() - info["at"] < LOST_AFTER_S:
                continue
            if info["attempt"] >= MAX_RUN_ATTEMPTS:
                why = f"its run was never created ({info['attempt']} requests)"
                _give_up(context, cursor, key, None, why)
                continue
            record = read_version(store, key)
            with_base = key == cursor.base_run_key and store.current(PRETRAINED_MODEL) is None
            context.log.warning(
                f"dataset version {key}: its run was never created; requesting again"
            )
            source = record.source.uri if record else ""
            attempt = info["attempt"] + 1
            requests.append(_track(cursor, key, info["fp"], source, with_base, attempt=attempt))
        elif run.status == dg.DagsterRunStatus.SUCCESS:
            del cursor.runs[key]
        elif (
            run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
            and run.tags.get(WILL_RETRY_TAG) != "true"
        ):
            _give_up(context, cursor, key, run, run_outcome(instance, run))
    return requests


def run_outcome(instance, run: dg.DagsterRun) -> str:
    """How a finished, unsuccessful run ended, in words a person acts on (its run group's events)."""
    rid = run.run_id[:8]
    if run.status == dg.DagsterRunStatus.CANCELED:
        return f"run {rid} was cancelled; not re-requested (launch retrain_job for it to resume)"
    group = instance.get_run_group(run.run_id)
    gate, refused, failed = None, [], []
    for member in group[1] if group else [run]:
        this_run = member.run_id == run.run_id
        for entry in instance.all_logs(member.run_id):
            event = entry.dagster_event
            if event is None:
                continue
            if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                evaluation = event.event_specific_data
                if evaluation.passed or evaluation.severity != dg.AssetCheckSeverity.ERROR:
                    continue
                if evaluation.check_name == "quality_gate":
                    gate = evaluation.description or "refused"
                elif this_run:
                    refused.append(
                        f"{evaluation.check_name} ({evaluation.description or 'failed'})"
                    )
            elif event.event_type == dg.DagsterEventType.STEP_FAILURE and this_run:
                failed.append(f"{event.step_key} ({_first_line(event.step_failure_data.error)})")
    if gate is not None:
        return f"trained, but the quality gate refused the model: {gate}"
    if refused:  # a blocking data check stopped the chain: the data needs fixing, not the run
        return f"run {rid}: blocking check {'; '.join(refused)[:300]} refused the data"
    steps = "; ".join(failed) or "the run worker (no step failed: see the run's events)"
    return f"run {rid} failed at {steps}; fix it, then re-execute run {rid} from failure"


def _first_line(error) -> str:
    """The user's exception (innermost cause, not Dagster's wrapper), first line."""
    while error is not None and error.cause is not None:
        error = error.cause
    text = error.message.strip() if error is not None else ""
    return text.splitlines()[0][:160] if text else "?"


def _give_up(context, cursor: LandingCursor, key: str, run, why: str) -> None:
    cursor.runs.pop(key, None)
    cursor.failed[key] = why
    if run is not None:
        context.instance.add_run_tags(run.run_id, {STATUS_TAG: "failed: " + why[:200]})
    context.log.warning(f"dataset version {key}: {why}")


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
    description="New data in the landing zone -> a dataset version (partition) and a retrain_job run for it.",
)
def landing_zone_sensor(
    context: dg.SensorEvaluationContext, landing: LandingZoneResource, storage: StorageResource
) -> dg.SensorResult:
    return evaluate_landing(context, landing, storage)


sensors: list[dg.SensorDefinition] = [landing_zone_sensor, on_landing.tuned_retrain_sensor]
