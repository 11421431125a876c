"""Sensors that turn newly landed data into dataset versions and retraining runs.

``landing_zone_sensor`` watches :class:`LandingZoneResource` and, for each new *complete* version
(folder with ``_SUCCESS``, or a file unchanged since the previous tick), records its source with
``write_version`` (before any run can read it), adds the partition through
``dynamic_partitions_requests`` and requests ``retrain_job`` for it.

Idempotence, in layers:

- the cursor (returned in ``SensorResult`` only, never ``update_cursor``) remembers each registered
  version with its listing signature, so repeated ticks do no work and request nothing;
- a version already present as a partition (cursor lost, or registered by the CLI) is never added again;
- every run key is ``{version}:{content fingerprint}``: the daemon drops a request whose key it has
  seen, so even a lost cursor cannot start a duplicate run, while a deleted version re-landed with
  *different* content still runs (Dagster's run-key dedup is permanent).

A problem with one entry (bad key, unsupported file, no data files, content changed after
registration) is logged once and listed in the skip reason; it never blocks the other entries.
"""

import json
from dataclasses import dataclass, field

import dagster as dg

from finetune_assets.data.labels import LabelError, read_manifest
from finetune_assets.data.sources import SourceError, SourceSpec, list_files
from finetune_assets.jobs import PRETRAINED, VERSION_CHAIN, retrain_job
from finetune_assets.partitions import DATASET_VERSIONS, InvalidVersionKey, validate_version_key
from finetune_assets.resources.landing import LandedEntry, LandingZoneResource, fingerprint, strip_format_suffix
from finetune_assets.resources.storage import StorageResource
from finetune_assets.versions import read_version, write_version

CURSOR_VERSION = 1
RUN_KEY_TAG = "dagster/run_key"
VERSION_TAG = "finetune_assets/dataset_version"
FINGERPRINT_TAG = "finetune_assets/fingerprint"
SOURCE_TAG = "finetune_assets/source"


@dataclass
class LandingCursor:
    """What the sensor remembers between ticks (JSON in the sensor cursor)."""

    registered: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> {fp, sig}
    pending: dict[str, str] = field(default_factory=dict)  # file key -> signature seen last tick
    awaiting_base: dict[str, str] = field(default_factory=dict)  # key -> fp: run waits for pretrained_model
    base_run_key: str | None = None  # the run that builds pretrained_model, while it is unpublished
    reported: dict[str, str] = field(default_factory=dict)  # entry -> problem already logged

    @classmethod
    def parse(cls, raw: str | None) -> "LandingCursor":
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls()  # an unreadable cursor behaves like a reset one: partitions + run keys still dedupe
        if data.get("v") != CURSOR_VERSION:
            return cls()
        return cls(registered=data.get("registered", {}), pending=data.get("pending", {}),
                   awaiting_base=data.get("awaiting_base", {}), base_run_key=data.get("base_run_key"),
                   reported=data.get("reported", {}))

    def dumps(self) -> str:
        return json.dumps({"v": CURSOR_VERSION, "registered": self.registered, "pending": self.pending,
                           "awaiting_base": self.awaiting_base, "base_run_key": self.base_run_key,
                           "reported": self.reported}, sort_keys=True)


def run_key(key: str, fp: str) -> str:
    return f"{key}:{fp}"


def retrain_request(key: str, fp: str, source: str, with_base: bool) -> dg.RunRequest:
    """One retrain run for a version; ``pretrained_model`` only while it has never been published."""
    assets = [*VERSION_CHAIN, *((PRETRAINED,) if with_base else ())]
    return dg.RunRequest(
        run_key=run_key(key, fp),
        partition_key=key,
        asset_selection=[dg.AssetKey(a) for a in assets],
        tags={VERSION_TAG: key, FINGERPRINT_TAG: fp, SOURCE_TAG: source[-255:]},
    )


def _base_run_failed(instance: dg.DagsterInstance, key: str | None) -> bool:
    """Whether the run meant to build pretrained_model ended without building it (so another may try)."""
    if key is None:
        return True
    runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: key}), limit=1)
    return bool(runs) and runs[0].status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


def evaluate_landing(context: dg.SensorEvaluationContext, landing: LandingZoneResource,
                     storage: StorageResource) -> dg.SensorResult:
    """One tick; a plain function so tests and the sensor share it."""
    cursor = LandingCursor.parse(context.cursor)
    store = storage.storage()
    instance = context.instance
    existing = set(instance.get_dynamic_partitions(DATASET_VERSIONS))
    entries = landing.list_entries()
    problems: dict[str, str] = {}  # entry name -> why it was skipped (malformed / conflicting)
    waiting: list[str] = []  # why complete-looking versions are not yet registered
    new_partitions: list[str] = []
    ready: list[tuple[str, str, str]] = []  # (key, fp, source) whose runs to request this tick
    rerequest: list[dg.RunRequest] = []

    by_key: dict[str, list[LandedEntry]] = {}
    for e in entries:
        by_key.setdefault(e.key, []).append(e)
    seen_keys = set(by_key)

    for key, group in sorted(by_key.items()):
        if len(group) > 1:
            names = ", ".join(e.name for e in group)
            for e in group:
                problems[e.name] = f"version key {key!r} is ambiguous ({names}): keep one, rename the others"
            continue
        e = group[0]
        if not e.is_dir and strip_format_suffix(e.name) is None:
            problems[e.name] = "unsupported file type (use .csv, .tsv, .jsonl, .json or .parquet, or a folder)"
            continue
        try:
            validate_version_key(key)
        except InvalidVersionKey as err:
            problems[e.name] = str(err)
            continue
        prev = cursor.registered.get(key)
        if prev is not None and prev["sig"] == e.signature:
            continue  # registered, unchanged: the common case, no I/O beyond the listing
        if e.is_dir and not e.marker_present:
            waiting.append(f"{e.name}: waiting for {landing.success_marker}")
            continue
        if not e.is_dir and prev is None and cursor.pending.get(key) != e.signature:
            cursor.pending[key] = e.signature
            waiting.append(f"{e.name}: waiting one tick for its size and mtime to stop changing")
            continue
        cursor.pending.pop(key, None)
        if e.is_dir:
            try:
                list_files(e.uri)
            except SourceError as err:
                problems[e.name] = str(err)
                continue
        fp = fingerprint(e.uri)
        if prev is not None:
            if prev["fp"] != fp:
                problems[e.name] = (f"content changed after version {key} was registered (fingerprint "
                                    f"{prev['fp']} -> {fp}); versions are immutable: land it under a new key")
            prev["sig"] = e.signature
            continue
        if key in existing:  # cursor reset, or registered by the CLI
            record = read_version(store, key)
            if record is not None and record.fingerprint == fp:
                cursor.registered[key] = {"fp": fp, "sig": e.signature}
                # Same key and content as before: the daemon drops this by run key if it already ran.
                rerequest.append(retrain_request(key, fp, e.uri, with_base=False))
            else:
                problems[e.name] = (f"dataset version {key} is already registered from "
                                    f"{record.source.uri if record else 'an unknown source'}; "
                                    "land the new data under a new key")
            continue
        try:  # a folder drop may carry its label set (data/labels.py MANIFEST); else the seed's classes
            labels = read_manifest(e.uri) if e.is_dir else None
        except LabelError as err:
            problems[e.name] = str(err)
            continue
        write_version(store, key, SourceSpec(uri=e.uri), fingerprint=fp, labels=labels)  # before the run can start
        cursor.registered[key] = {"fp": fp, "sig": e.signature}
        new_partitions.append(key)
        ready.append((key, fp, e.uri))

    # Files that vanished before they settled are forgotten; reports clear when the entry is fixed.
    cursor.pending = {k: v for k, v in cursor.pending.items() if k in seen_keys}

    run_requests = _requests_with_base(context, cursor, store, ready, waiting) + rerequest
    _log_problems(context, cursor, problems)

    dpr = [dg.AddDynamicPartitionsRequest(DATASET_VERSIONS, new_partitions)] if new_partitions else []
    if run_requests or dpr:
        for key in new_partitions:
            context.log.info(f"registered dataset version {key} (fingerprint {cursor.registered[key]['fp']})")
        return dg.SensorResult(run_requests=run_requests, dynamic_partitions_requests=dpr,
                               cursor=cursor.dumps())
    reasons = [*(f"{name}: {why}" for name, why in sorted(problems.items())), *waiting]
    skip = "; ".join(reasons) if reasons else f"no new dataset versions in {landing.location()}"
    return dg.SensorResult(skip_reason=dg.SkipReason(skip), cursor=cursor.dumps())


def _requests_with_base(context, cursor: LandingCursor, store, ready, waiting) -> list[dg.RunRequest]:
    """Run requests for ready versions; only one run at a time builds a missing ``pretrained_model``.

    Every version shares the base model: two runs publishing it concurrently would race, so while it
    is unpublished the first version's run builds it and the others wait in the cursor.
    """
    queue = [(k, fp, src) for k, fp, src in ready]
    for key, fp in list(cursor.awaiting_base.items()):
        record = read_version(store, key)
        queue.insert(0, (key, fp, record.source.uri if record else ""))
    if store.current(PRETRAINED) is not None:
        cursor.awaiting_base, cursor.base_run_key = {}, None
        return [retrain_request(k, fp, src, with_base=False) for k, fp, src in queue]
    requests = []
    if queue and _base_run_failed(context.instance, cursor.base_run_key):
        key, fp, src = queue.pop(0)
        requests.append(retrain_request(key, fp, src, with_base=True))
        cursor.base_run_key = run_key(key, fp)
        cursor.awaiting_base.pop(key, None)
    for key, fp, _ in queue:
        cursor.awaiting_base[key] = fp
        waiting.append(f"{key}: registered; its run waits until pretrained_model is built "
                       f"(by run {cursor.base_run_key})")
    return requests


def _log_problems(context, cursor: LandingCursor, problems: dict[str, str]) -> None:
    for name, why in sorted(problems.items()):
        if cursor.reported.get(name) != why:
            context.log.warning(f"skipping {name}: {why}")
    cursor.reported = dict(problems)


@dg.sensor(
    name="landing_zone_sensor",
    job=retrain_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="New data in the landing zone -> a dataset version (partition) and a retrain_job run for it.",
)
def landing_zone_sensor(context: dg.SensorEvaluationContext, landing: LandingZoneResource,
                        storage: StorageResource) -> dg.SensorResult:
    return evaluate_landing(context, landing, storage)


sensors: list[dg.SensorDefinition] = [landing_zone_sensor]
