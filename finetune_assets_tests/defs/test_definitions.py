"""The code location loads, and its graph matches the committed snapshot.

An accidental change to the graph (a key, a dependency, a partitioning, a check, a sensor, a job)
fails here. To accept an intended change: ``UPDATE_SNAPSHOTS=1 pytest
finetune_assets_tests/defs/test_definitions.py``.
"""

import json
import os
from pathlib import Path

import dagster as dg

from finetune_assets.definitions import build_defs, defs

SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.json"


def launchpad_schema(assets_def: dg.AssetsDefinition) -> dict | None:
    """The asset's config as the launchpad shows it: per field its type (or choices), default and
    whether required.
    """
    field = assets_def.op.config_field
    if field is None or not hasattr(field.config_type, "fields"):  # no config (Dagster shows Any)
        return None
    out = {}
    for name, f in field.config_type.fields.items():
        t = getattr(f.config_type, "inner_type", f.config_type)  # Noneable wraps the type
        kind = (
            [v.config_value for v in t.enum_values]
            if hasattr(t, "enum_values")
            else t.given_name or t.key
        )
        out[name] = {
            "type": kind,
            "default": f.default_value if f.default_provided else None,
            "required": f.is_required,
        }
    return out


def graph_snapshot(d: dg.Definitions) -> dict:
    graph = d.resolve_asset_graph()
    schemas = {
        k.to_user_string(): launchpad_schema(a)
        for a in d.assets or ()
        if isinstance(a, dg.AssetsDefinition)
        for k in a.keys
    }
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets[key.to_user_string()] = {
            "deps": sorted(p.to_user_string() for p in node.parent_keys),
            "partitions": getattr(node.partitions_def, "name", None)
            if node.partitions_def
            else None,
            "group": node.group_name,
            "kinds": sorted(node.kinds),
            "code_version": node.code_version,
            "owners": list(node.owners),
            "has_description": bool(node.description),
            # automation.py's named conditions (eager() and the like carry labels too)
            "automation": (
                node.automation_condition.get_label() or type(node.automation_condition).__name__
            )
            if node.automation_condition
            else None,
            "launchpad": schemas.get(key.to_user_string()),
        }
    checks = sorted(
        f"{k.asset_key.to_user_string()}:{k.name}:"
        + ("blocking" if graph.get_check_spec(k).blocking else "non-blocking")
        for k in graph.asset_check_keys
    )
    repo = d.get_repository_def()
    return {
        "assets": assets,
        "checks": checks,
        "sensors": sorted(s.name for s in repo.sensor_defs),
        "jobs": sorted(j for j in repo.job_names if not j.startswith("__")),
        "resources": sorted(d.resources or {}),
    }


def test_code_location_loads():
    loaded = defs()  # as the code server loads it
    dg.Definitions.validate_loadable(loaded)
    repo = loaded.get_repository_def()
    assert repo.get_all_jobs()  # the implicit asset job resolves with every resource bound


def test_graph_matches_snapshot(tmp_path):
    current = graph_snapshot(build_defs(str(tmp_path)))
    if os.environ.get("UPDATE_SNAPSHOTS") == "1" or not SNAPSHOT.exists():
        SNAPSHOT.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    assert current == json.loads(SNAPSHOT.read_text())


def test_every_asset_is_described_and_owned(tmp_path):
    for key, node in graph_snapshot(build_defs(str(tmp_path)))["assets"].items():
        assert node["has_description"], f"{key} has no description (its docstring shows in the UI)"
        assert node["owners"], f"{key} has no owner"
        assert node["code_version"], f"{key} has no code version (staleness needs one)"


def test_training_and_promotion_run_in_pools(tmp_path):
    """Pools serialize what must not overlap (docs/reliability.md: limits set in dagster.yaml)."""
    graph = build_defs(str(tmp_path)).resolve_asset_graph()
    pools = {k.to_user_string(): graph.get(k).pools for k in graph.get_all_asset_keys()}
    assert pools["champion_model"] == {"promotion"}
    assert pools["finetuned_model"] == {"training"}


def test_deployment_instance_serializes_one_partition_and_sizes_the_pools(tmp_path):
    """deploy/instance/dagster.yaml, loaded by a real instance: a second run of a partition waits
    for the first (the run queue's own tag-limit counter decides), other partitions do not; pools
    default to 1.
    """
    import yaml
    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
    from dagster._utils.tags import TagConcurrencyLimitsCounter

    settings = yaml.safe_load(
        (Path(__file__).parents[2] / "deploy" / "instance" / "dagster.yaml").read_text()
    )
    with dg.instance_for_test(overrides=settings, temp_dir=str(tmp_path)) as instance:
        config = instance.get_concurrency_config()
        assert config.pool_config.default_pool_limit == 1
        assert instance.run_retries_enabled

        def run(partition, status=DagsterRunStatus.NOT_STARTED):
            return DagsterRun(
                job_name="retrain_job",
                run_id=f"{partition}-{status.value}".lower(),
                tags={"dagster/partition": partition},
                status=status,
            )

        counter = TagConcurrencyLimitsCounter(
            config.run_queue_config.tag_concurrency_limits, [run("v1", DagsterRunStatus.STARTED)]
        )
        assert counter.is_blocked(run("v1")) and not counter.is_blocked(run("v2"))
    for job in ("retrain_job", "finetune_only_job"):
        tags = defs().resolve_job_def(job).tags
        assert (
            tags["dagster/max_retries"] == "2"
            and tags["dagster/retry_on_asset_or_op_failure"] == "false"
        )


def test_the_repository_is_a_dg_project_whose_defs_are_the_code_locations(tmp_path):
    """``dg check defs`` and ``dg list defs`` from the repository root (pyproject's [tool.dg]) load
    the same definitions as ``dagster -m finetune_assets.definitions``: every asset and check.
    """
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    dg_cli = Path(sys.executable).with_name("dg")
    env = {**os.environ, "FINETUNE_ASSETS_ROOT": str(tmp_path), "DAGSTER_HOME": str(tmp_path)}
    check = subprocess.run(
        [dg_cli, "check", "defs"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    listed = subprocess.run(
        [dg_cli, "list", "defs", "--json"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    got = json.loads(listed.stdout)
    repo_def = build_defs(str(tmp_path)).get_repository_def()
    assert {a["asset_key"] for a in got["assets"]} == {
        k.to_user_string() for k in repo_def.asset_graph.get_all_asset_keys()
    }
    assert len(got["asset_checks"]) == len(repo_def.asset_graph.asset_check_keys)
