"""The code location loads, and its graph matches the committed snapshot.

An accidental change to the graph (a key, a dependency, a partitioning, a check, a sensor, a job)
fails here. To accept an intended change: ``UPDATE_SNAPSHOTS=1 pytest finetune_assets_tests/test_definitions.py``.
"""

import json
import os
from pathlib import Path

import dagster as dg

from finetune_assets.definitions import build_defs, defs

SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.json"


def graph_snapshot(d: dg.Definitions) -> dict:
    graph = d.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets[key.to_user_string()] = {
            "deps": sorted(p.to_user_string() for p in node.parent_keys),
            "partitions": getattr(node.partitions_def, "name", None) if node.partitions_def else None,
            "group": node.group_name,
            "kinds": sorted(node.kinds),
            "code_version": node.code_version,
            "owners": list(node.owners),
            "has_description": bool(node.description),
            "automation": type(node.automation_condition).__name__ if node.automation_condition else None,
        }
    checks = sorted(
        f"{k.asset_key.to_user_string()}:{k.name}:{'blocking' if graph.get_check_spec(k).blocking else 'non-blocking'}"
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
    dg.Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
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
