"""`versions status`: per version and asset, materialized / stale / missing, as Dagster judges
it (the UI's stale flags), when, with which data version and run.
"""

from __future__ import annotations

from collections.abc import Sequence

from finetune_assets.cli.common import CliError, open_instance, print_json, root_of, when

# Project and third-party modules are imported inside the functions that use them, never
# here: `--help`, and `predict` on a local folder, load neither Dagster nor MLflow
# (cli/__init__.py).


def _latest(instance, asset: str, partition: str | None):
    import dagster as dg

    key = dg.AssetKey(asset)
    target = (
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]) if partition else key
    )
    records = instance.fetch_materializations(target, limit=1).records
    return records[0] if records else None


def _data_version(record) -> str | None:
    mat = record.asset_materialization if record is not None else None
    return mat.tags.get("dagster/data_version") if mat is not None and mat.tags else None


def stale_resolver(instance, root: str):
    """Dagster's own staleness (the UI's "stale" flags, GraphQL ``staleStatus``) over the code
    location's asset graph: code versions (config defaults folded in), recorded input data versions.
    """
    from finetune_assets.definitions import build_defs
    from finetune_assets.defs.dagster_internals import stale_status_resolver

    return stale_status_resolver(instance, build_defs(root).resolve_asset_graph())


def _stale_because(resolver, asset: str, partition: str | None) -> list[str]:
    """Dagster's stale causes, each as "<asset>: <reason>" (the asset itself for a code change)."""
    import dagster as dg

    from finetune_assets.defs.dagster_internals import StaleStatus

    key = dg.AssetKey(asset)
    if resolver.get_status(key, partition) != StaleStatus.STALE:
        return []
    causes = []
    for cause in resolver.get_stale_causes(key, partition):
        where = (cause.dependency or cause.key).asset_key.to_user_string()
        text = f"{where}: {cause.reason}"
        if text not in causes:
            causes.append(text)
    return causes


def version_status(instance, versions: Sequence[str], resolver) -> list[dict]:
    """One row per (version, asset): materialized / stale / missing, when, data version, run.

    "stale" is Dagster's judgement (``resolver``: ``stale_resolver``), never a rule of our own.
    """
    from finetune_assets.core.io.contracts import PARTITIONED_ASSETS, PRETRAINED_MODEL
    from finetune_assets.defs.versions.run_outcome import STATUS_TAG

    rows = []
    # The graph as users see it in `versions status`: the unpartitioned base model, then per
    # version.
    cells = [(None, PRETRAINED_MODEL)] + [(v, a) for v in versions for a in PARTITIONED_ASSETS]
    failed = {v: _failed_last_run(instance, v) for v in versions}
    for version, asset in cells:
        record = _latest(instance, asset, version)
        row = {
            "version": version or "-",
            "asset": asset,
            "status": "missing",
            "materialized_at": None,
            "data_version": None,
            "run_id": None,
            "stale_because": [],
        }
        if record is not None:
            stale = _stale_because(resolver, asset, version)
            row.update(
                status="stale" if stale else "materialized",
                materialized_at=when(record.timestamp),
                data_version=_data_version(record),
                run_id=record.run_id,
                stale_because=stale,
            )
        elif version is not None and failed.get(version) is not None:
            # never materialized and the version's latest run failed: say so, not "missing"
            run = failed[version]
            row.update(status="failed", run_id=run.run_id, detail=run.tags.get(STATUS_TAG, ""))
        rows.append(row)
    return rows


def _failed_last_run(instance, version: str):
    """The version's most recent run if it failed or was cancelled (the sensor's retry rule may
    tag it).
    """
    import dagster as dg

    records = instance.get_run_records(dg.RunsFilter(tags={"dagster/partition": version}), limit=1)
    run = records[0].dagster_run if records else None
    return (
        run
        if run is not None
        and run.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
        else None
    )


def cmd_versions_status(args) -> int:
    from finetune_assets.defs.versions.partitions import DATASET_VERSIONS

    instance = open_instance()
    known = instance.get_dynamic_partitions(DATASET_VERSIONS)
    unknown = [v for v in args.versions if v not in known]
    if unknown:
        raise CliError(
            f"dataset version(s) not registered: {', '.join(unknown)} "
            f"(registered: {', '.join(known) or 'none'}; add one with `finetune-assets versions "
            "add`)"
        )
    rows = version_status(instance, args.versions or known, stale_resolver(instance, root_of(args)))
    if args.json:
        print_json(rows)
        return 0
    header = ("version", "asset", "status", "materialized_at", "data_version", "run")
    table = [header] + [
        (
            r["version"],
            r["asset"],
            r["status"] + (f" ({'; '.join(r['stale_because'])})" if r["stale_because"] else ""),
            r["materialized_at"] or "-",
            r["data_version"] or "-",
            (r["run_id"] or "-")[:8],
        )
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0
