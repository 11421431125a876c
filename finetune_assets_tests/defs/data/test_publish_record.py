"""A run killed after ``CURRENT`` moved but before Dagster recorded the materialization: the next
run notices storage ahead of Dagster's record and restores the recorded attempt before reading.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef

from finetune_assets.core.io.storage import Storage
from finetune_assets.defs.provenance import read_recorded

# The writer: publishes ``tokenized_reviews`` (the asset name only; any content) and, with KILL set,
# SIGKILLs its own process right after the publish, i.e. in the window before Dagster records it.
WRITER = textwrap.dedent("""
    import os, signal, sys
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef
    from finetune_assets.core.io.storage import Storage

    root, home, content, kill = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"

    @dg.asset(name="tokenized_reviews")
    def writer():
        with Storage(root).publish("tokenized_reviews") as staging:
            (staging.local_dir / "data.txt").write_text(content)
            staging.data_version = content
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
        return dg.MaterializeResult(data_version=dg.DataVersion(content))

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(home)) as instance:
        assert dg.materialize([writer], instance=instance).success
""")


def _write(root, home, content: str, kill: bool) -> int:
    return subprocess.run(
        [sys.executable, "-c", WRITER, str(root), str(home), content, "1" if kill else "0"],
        capture_output=True,
        timeout=300,
    ).returncode


def test_a_kill_between_publish_and_record_is_repaired_by_the_next_reader(tmp_path, storage_root):
    home = tmp_path / "home"
    home.mkdir()
    assert _write(storage_root, home, "recorded", kill=False) == 0
    assert _write(storage_root, home, "unrecorded", kill=True) == -9  # killed in the window
    store = Storage(str(storage_root))
    # storage ahead of Dagster
    assert store.require("tokenized_reviews").data_version == "unrecorded"

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        (record,) = instance.fetch_materializations(
            dg.AssetKey("tokenized_reviews"), limit=5
        ).records
        assert record.asset_materialization.tags["dagster/data_version"] == "recorded"
        read = read_recorded(instance, store, "tokenized_reviews")
        assert read.data_version == "recorded"
        assert store.require("tokenized_reviews").data_version == "recorded"  # CURRENT repaired
        assert read_recorded(instance, store, "tokenized_reviews").attempt == read.attempt  # stable


def test_storage_with_no_dagster_record_is_left_alone(instance, storage_root):
    store = Storage(str(storage_root))
    with store.publish("raw_reviews", "v1") as staging:  # published by a script, never by a run
        staging.data_version = "x"
    assert read_recorded(instance, store, "raw_reviews", "v1").data_version == "x"
    with pytest.raises(FileNotFoundError):
        read_recorded(instance, store, "mds_shards", "v1")
