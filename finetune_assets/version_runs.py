"""The runs of one dataset version, as the landing sensor requests and follows them.

A version is built by two runs, in order (``jobs.py``): data preparation (``DATA_PREPARATION``, and
``pretrained_model`` while it has never been published), then training (``TRAINING``), requested
once the first succeeded. Data preparation holds no pool, so every version's data proceeds while
one version trains; the training run waits in the run queue for the ``training`` slot, never in
an idle run pod.

The sensor never re-runs an ended run: Dagster's run retries are the one retry layer. Only a
request that never became a run is requested again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import dagster as dg

from finetune_assets.contracts import PRETRAINED_MODEL
from finetune_assets.dagster_internals import WILL_RETRY_TAG
from finetune_assets.dataset_versions.registry import read_version
from finetune_assets.jobs import DATA_PREPARATION, TRAINING, pretrained_model

CURSOR_VERSION = 1
RUN_KEY_TAG = "dagster/run_key"
VERSION_TAG = "finetune_assets/dataset_version"
FINGERPRINT_TAG = "finetune_assets/fingerprint"
SOURCE_TAG = "finetune_assets/source"
ATTEMPT_TAG = "finetune_assets/attempt"
PHASE_TAG = "finetune_assets/phase"
STATUS_TAG = "finetune_assets/version_status"  # on a run the sensor gave up on: in the run list
PREPARE, TRAIN = "prepare", "train"
MAX_RUN_ATTEMPTS = 3  # requests per run that never became a run before leaving it to a person
LOST_AFTER_S = 600.0  # a requested run that never appeared by then (dropped request): again


@dataclass
class LandingCursor:
    """What the sensor remembers between ticks (JSON in the sensor cursor)."""

    registered: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> {fp, sig}
    pending: dict[str, str] = field(default_factory=dict)  # file key -> signature seen last tick
    awaiting_base: dict[str, str] = field(default_factory=dict)  # key -> fp: waits for the base
    base_run_key: str | None = None  # the version whose run builds pretrained_model
    reported: dict[str, str] = field(default_factory=dict)  # entry -> problem already logged
    # key -> {fp, attempt, at, phase}: requested, not yet succeeded (no phase: a whole-chain run
    # requested by an older release, done when it succeeds)
    runs: dict[str, dict] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # key -> why its run is given up
    tables: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> {seen, rows}

    @classmethod
    def parse(cls, raw: str | None) -> LandingCursor:
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls()  # behaves like a reset cursor: partitions + run keys still dedupe
        if data.get("v") != CURSOR_VERSION:
            return cls()
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    def dumps(self) -> str:
        return json.dumps(
            {"v": CURSOR_VERSION, **{k: getattr(self, k) for k in self.__dataclass_fields__}},
            sort_keys=True,
        )


def run_key(key: str, fp: str, attempt: int = 1, phase: str = PREPARE) -> str:
    """``{key}:{fp}`` for a version's data preparation, ``{key}:{fp}:train`` for its training; a
    re-request of a lost request adds ``:{attempt}`` (the daemon drops a run key it has seen).
    """
    base = f"{key}:{fp}" if phase == PREPARE else f"{key}:{fp}:{phase}"
    return base if attempt <= 1 else f"{base}:{attempt}"


def retrain_request(
    key: str, fp: str, source: str, with_base: bool, attempt: int = 1, phase: str = PREPARE
) -> dg.RunRequest:
    """One run of a version: its data preparation (with ``pretrained_model`` only while it has
    never been published), or its training and promotion.
    """
    if phase == PREPARE:
        assets = [*DATA_PREPARATION, *((pretrained_model,) if with_base else ())]
    else:
        assets = list(TRAINING)
    return dg.RunRequest(
        run_key=run_key(key, fp, attempt, phase),
        partition_key=key,
        asset_selection=[a.key for a in assets],
        tags={
            VERSION_TAG: key,
            FINGERPRINT_TAG: fp,
            SOURCE_TAG: source[-255:],
            ATTEMPT_TAG: str(attempt),
            PHASE_TAG: phase,
        },
    )


def track(
    cursor: LandingCursor,
    key: str,
    fp: str,
    source: str,
    with_base: bool,
    attempt: int = 1,
    phase: str = PREPARE,
) -> dg.RunRequest:
    """Request a run and remember it, so that ``follow_runs`` sees how it ends."""
    cursor.runs[key] = {"fp": fp, "attempt": attempt, "at": time.time(), "phase": phase}
    return retrain_request(key, fp, source, with_base=with_base, attempt=attempt, phase=phase)


def requests_with_base(cursor: LandingCursor, store, ready, waiting) -> list[dg.RunRequest]:
    """Run requests for ready versions; only one run at a time builds a missing
    ``pretrained_model``.

    Every version shares the base model: two runs publishing it concurrently would race, so while it
    is unpublished one version's run builds it (``base_run_key`` names that version) and the others
    wait in the cursor. When that run is given up (``follow_runs``), the next waiting version builds
    it.
    """
    queue = list(ready)
    for key, fp in list(cursor.awaiting_base.items()):
        record = read_version(store, key)
        queue.insert(0, (key, fp, record.source.uri if record else ""))
    if store.current(PRETRAINED_MODEL) is not None:
        cursor.awaiting_base, cursor.base_run_key = {}, None
        return [track(cursor, k, fp, src, with_base=False) for k, fp, src in queue]
    requests = []
    if queue and cursor.base_run_key not in cursor.runs:
        key, fp, src = queue.pop(0)
        requests.append(track(cursor, key, fp, src, with_base=True))
        cursor.base_run_key = key
        cursor.awaiting_base.pop(key, None)
    for key, fp, _ in queue:
        cursor.awaiting_base[key] = fp
        waiting.append(
            f"{key}: registered; its run waits until pretrained_model is built "
            f"(by the run of {cursor.base_run_key})"
        )
    return requests


def follow_runs(context, cursor: LandingCursor, store) -> list[dg.RunRequest]:
    """Follow each version's run to its end: a successful data preparation requests the training
    run; any other end is reported, never re-run.

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

    def key_of(key: str, info: dict) -> str:
        return run_key(key, info["fp"], info["attempt"], info.get("phase", PREPARE))

    wanted = [key_of(key, info) for key, info in cursor.runs.items()]
    latest: dict[str, dg.DagsterRun] = {}
    if wanted:
        # Newest first: a run the daemon retried (same tags) shadows the run it retried.
        for r in instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: wanted})):
            latest.setdefault(r.tags.get(RUN_KEY_TAG), r)
    for key, info in sorted(cursor.runs.items()):
        phase = info.get("phase")
        run = latest.get(key_of(key, info))
        if run is None:
            if time.time() - info["at"] < LOST_AFTER_S:
                continue
            if info["attempt"] >= MAX_RUN_ATTEMPTS:
                why = f"its run was never created ({info['attempt']} requests)"
                give_up(context, cursor, key, None, why)
                continue
            record = read_version(store, key)
            with_base = (
                phase != TRAIN
                and key == cursor.base_run_key
                and store.current(PRETRAINED_MODEL) is None
            )
            context.log.warning(
                f"dataset version {key}: its run was never created; requesting again"
            )
            source = record.source.uri if record else ""
            attempt = info["attempt"] + 1
            requests.append(
                track(cursor, key, info["fp"], source, with_base, attempt, phase or PREPARE)
            )
        elif run.status == dg.DagsterRunStatus.SUCCESS:
            del cursor.runs[key]
            if phase == PREPARE:  # its data is ready: the training run queues for its slot
                requests.append(
                    track(cursor, key, info["fp"], run.tags.get(SOURCE_TAG, ""), False, 1, TRAIN)
                )
        elif (
            run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
            and run.tags.get(WILL_RETRY_TAG) != "true"
        ):
            give_up(context, cursor, key, run, run_outcome(instance, run))
    return requests


# What a failure diagnosis reads of a run group's event log: check verdicts and step failures only
# (filtered in the storage's query). Every trainer output line is an event of its own: reading all
# of them made a tick's cost grow with hours of training.
DIAGNOSIS_EVENTS = {dg.DagsterEventType.ASSET_CHECK_EVALUATION, dg.DagsterEventType.STEP_FAILURE}


def run_outcome(instance, run: dg.DagsterRun) -> str:
    """How a finished, unsuccessful run ended, in words a person acts on (its run group's
    events).
    """
    rid = run.run_id[:8]
    if run.status == dg.DagsterRunStatus.CANCELED:
        return f"run {rid} was cancelled; not re-requested (launch retrain_job for it to resume)"
    group = instance.get_run_group(run.run_id)
    gate, refused, failed = None, [], []
    for member in group[1] if group else [run]:
        this_run = member.run_id == run.run_id
        for entry in instance.all_logs(member.run_id, of_type=DIAGNOSIS_EVENTS):
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
                    fix = getattr(evaluation.metadata.get("fix"), "value", "")
                    refused.append(
                        f"{evaluation.check_name} ({evaluation.description or 'failed'}"
                        + (f"; fix: {fix})" if fix else ")")
                    )
            elif event.event_type == dg.DagsterEventType.STEP_FAILURE and this_run:
                failed.append(f"{event.step_key} ({_first_line(event.step_failure_data.error)})")
    if gate is not None:
        return f"trained, but the quality gate refused the model: {gate}"
    if refused:  # a blocking data check stopped the chain: the data needs fixing, not the run
        return f"run {rid}: blocking check {'; '.join(refused)[:800]} refused the data"
    steps = "; ".join(failed) or "the run worker (no step failed: see the run's events)"
    return f"run {rid} failed at {steps}; fix it, then re-execute run {rid} from failure"


def _first_line(error) -> str:
    """The user's exception (innermost cause, not Dagster's wrapper), first line."""
    while error is not None and error.cause is not None:
        error = error.cause
    text = error.message.strip() if error is not None else ""
    return text.splitlines()[0][:160] if text else "?"


def give_up(context, cursor: LandingCursor, key: str, run, why: str) -> None:
    cursor.runs.pop(key, None)
    cursor.failed[key] = why
    if run is not None:
        context.instance.add_run_tags(run.run_id, {STATUS_TAG: "failed: " + why[:200]})
    context.log.warning(f"dataset version {key}: {why}")
