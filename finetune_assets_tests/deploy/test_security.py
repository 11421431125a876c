"""Hostile configuration: remote code, keys and paths escaping the storage root, unknown config
keys.
"""

import json

import dagster as dg
import pytest

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.prep.pretrained import save_pretrained_model
from finetune_assets.core.sources import SourceSpec
from finetune_assets.definitions import build_defs
from finetune_assets.defs.versions.partitions import InvalidVersionKey, validate_version_key
from finetune_assets.defs.versions.register import register_version

HOSTILE_KEYS = [
    "../etc",
    "..",
    "a/b",
    "a b",
    "",
    "x" * 64,
    "-lead",
    "trail.",
    "v1\n",
    "a\\b",
    "%2e%2e",
]


def _plant_remote_code(model_dir, marker, model_type):
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["model_type"] = model_type
    cfg["auto_map"] = {
        "AutoConfig": "evil.EvilConfig",
        "AutoModelForSequenceClassification": "evil.EvilModel",
    }
    (model_dir / "config.json").write_text(json.dumps(cfg))
    (model_dir / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import BertConfig as EvilConfig, BertForSequenceClassification as "
        "EvilModel\n"
    )


@pytest.mark.parametrize("model_type", ["bert", "evil-custom"])
def test_model_source_remote_code_is_never_executed(tiny_model_dir, tmp_path, model_type):
    marker = tmp_path / "remote-code-ran"
    _plant_remote_code(tiny_model_dir, marker, model_type)
    out = tmp_path / "out"
    out.mkdir()
    # a known architecture loads with transformers' own class, ignoring auto_map
    if model_type == "bert":
        summary = save_pretrained_model(str(tiny_model_dir), None, out)
        assert summary.architecture == "BertForSequenceClassification"
    else:  # an unknown one is refused rather than importing the folder's Python
        with pytest.raises(
            Exception, match="evil-custom|trust_remote_code|not recognized|Unrecognized"
        ):
            save_pretrained_model(str(tiny_model_dir), None, out)
    assert not marker.exists()


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_hostile_version_keys_are_refused_everywhere(key, storage_root, instance):
    with pytest.raises(InvalidVersionKey, match="invalid dataset version key"):
        validate_version_key(key)
    storage = Storage(str(storage_root))
    with pytest.raises(InvalidVersionKey):
        storage.prefix("raw_reviews", key)
    with pytest.raises(InvalidVersionKey):
        register_version(instance, storage, key, SourceSpec(uri="builtin:sample"))
    assert instance.get_dynamic_partitions("dataset_versions") == []
    assert list(storage_root.iterdir()) == []


def test_storage_paths_cannot_escape_the_root(storage_root):
    storage = Storage(str(storage_root))
    with pytest.raises(ValueError, match="escapes"):
        storage.url("versions", "../../etc/passwd")
    with pytest.raises(ValueError, match="invalid asset name"):
        storage.prefix("../raw_reviews", "v1")


def test_unknown_config_keys_are_rejected(storage_root, instance):
    defs = build_defs(str(storage_root))
    register_version(instance, Storage(str(storage_root)), "v1", SourceSpec(uri="builtin:sample"))
    with pytest.raises(dg.DagsterInvalidConfigError, match="not_a_field"):
        dg.materialize(
            [defs.get_assets_def("raw_reviews")],
            instance=instance,
            partition_key="v1",
            resources={"storage": defs.resources["storage"]},
            run_config={"ops": {"raw_reviews": {"config": {"not_a_field": 1}}}},
        )
