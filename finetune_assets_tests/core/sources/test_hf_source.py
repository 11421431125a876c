"""``hf:`` sources pinned to a commit, ``-1`` labels quarantined, read in batches, configs passed
on. The hub is the narrowest part faked: ``HfApi.dataset_info`` answers a commit sha, and
``datasets.load_dataset`` returns a real ``datasets.Dataset`` (ClassLabel features) built here,
recording what it was asked for. No network.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import huggingface_hub
import pytest

from finetune_assets.core.sources import SourceSpec, iter_source
from finetune_assets_tests.core.sources.test_table_sources import _add, _raw, home  # noqa: F401

SHA = "0123456789abcdef0123456789abcdef01234567"
NAMES = ["neg", "pos"]


@pytest.fixture
def fake_hub(monkeypatch):
    calls: list[dict] = []
    texts = [f"review {i}: {'great' if i % 2 else 'bad'} product" for i in range(40)]
    labels = [i % 2 for i in range(40)]
    labels[5] = labels[17] = -1  # HF's "no label"
    ds = datasets.Dataset.from_dict(
        {"text": texts, "label": labels},
        features=datasets.Features(
            {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=NAMES)}
        ),
    )

    class Info:
        sha = SHA

    def dataset_info(self, repo_id, revision=None, **kwargs):
        calls.append({"info": repo_id, "revision": revision})
        return Info()

    def load_dataset(name, config=None, revision=None, split=None, **kwargs):
        calls.append({"load": name, "config": config, "revision": revision, "split": split})
        return ds

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_hf_version_records_the_commit_and_rereads_it(
    capsys,
    home,
    storage_root,
    fake_hub,  # noqa: F811
):
    code, out, err = _add(capsys, home, "h", "--source", "hf:owner/reviews:en", labels="neg,pos")
    assert code == 0, err
    record = json.loads(Path(home["store"].url("versions", "h.json")).read_text())
    assert record["source"]["revision"] == SHA and record["source"]["uri"] == "hf:owner/reviews:en"
    fake_hub.clear()
    meta, table = _raw(storage_root, "h")
    assert fake_hub and all(c["revision"] == SHA for c in fake_hub)
    assert {c["config"] for c in fake_hub} == {"en"}
    assert meta["rows_in"] == 40 and meta["rejected_by_reason"] == {"missing_label": 2}
    assert set(table.column("label").to_pylist()) == {"neg", "pos"}
    assert meta["hf_revision"] == SHA


def test_hf_reads_in_batches(fake_hub):
    spec = SourceSpec(uri="hf:owner/reviews", revision=SHA)
    blocks = list(iter_source(spec, block_bytes=10 * 1024))
    assert [b.num_rows for b in blocks] == [10, 10, 10, 10]
    assert [b.column("source_row")[0].as_py() for b in blocks] == [0, 10, 20, 30]
    assert blocks[0].column("label").to_pylist()[5] is None
