"""One ``launcher`` resource for training and the data fan-out: a launchpad override of
``resources.launcher.config`` reaches the slice workers, not only torchrun.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import dagster as dg

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.sources import SourceSpec
from finetune_assets.definitions import build_defs
from finetune_assets.defs.versions.register import register_version
from finetune_assets_tests.defs.data.test_data_assets import materialize


def test_launchpad_launcher_override_reaches_the_fanout_workers(
    storage_root: Path, instance, tiny_model_dir: Path, arabic_reviews: Path, tmp_path: Path
):
    calls = tmp_path / "calls"
    calls.mkdir()
    # An interpreter that notes each worker it starts, then runs it with the real one.
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\ntouch "{calls}/$$-$JOB_COMPLETION_INDEX"\nexec "{sys.executable}" "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)

    store = Storage(str(storage_root))
    materialize(storage_root, instance, ["pretrained_model"], tiny_model_dir=tiny_model_dir)
    register_version(instance, store, "v1", SourceSpec(uri=str(arabic_reviews / "RES2.csv")))
    materialize(storage_root, instance, ["raw_reviews"], "v1", raw_config={"batch_rows": 300})
    assert not list(calls.iterdir())

    defs = build_defs(str(storage_root))
    assets = [a for a in defs.assets if isinstance(a, dg.AssetsDefinition)]
    result = dg.materialize(
        assets,
        selection=["tokenized_reviews", "mds_shards"],
        instance=instance,
        partition_key="v1",
        resources=dict(defs.resources),
        run_config={
            "ops": {"tokenized_reviews": {"config": {"max_length": 64, "workers": 2}}},
            # what the launchpad's resources section holds
            "resources": {"launcher": {"config": {"python": str(python)}}},
        },
    )
    assert result.success
    parts = store.require("tokenized_reviews", "v1").metadata["parts"]
    workers = sorted(p.name.split("-")[1] for p in calls.iterdir())
    # every tokenizing and sharding worker ran under the overridden launcher's interpreter
    assert len(workers) >= 2 and parts >= 2
    assert set(workers) >= {"0", "1"}
