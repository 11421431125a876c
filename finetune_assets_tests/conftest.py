"""Shared fixtures: a tiny BERT built from a config, the real review files, a storage root, an
instance.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "arabic_reviews"
# CI clones main beside a copy of shared/; sessions run from /work/main
if not SHARED_DATA.exists():
    SHARED_DATA = Path("/work/shared/data/arabic_reviews")


# The tests that start the local Kubernetes control plane form a lane of their own. Under the
# README's test command (`-n 2 --dist loadgroup`, pytest-xdist) one worker runs them, in this order,
# beside a worker that runs every other test in its usual order: the plane's tests mostly wait on
# controllers and pods, which the other lane's tests fill. In CI the plane compiles in the
# background (minutes of Go) while the other lane runs; the plane lane's first test waits for the
# build (.ci/run). Without xdist (`-n 0`, a single test) they simply run last.
_PLANE_TESTS = (
    "finetune_assets_tests/core/launchers/k8s/",
    "finetune_assets_tests/deploy/test_deployment_backfill.py",
)


def _on_plane(item) -> bool:
    return any(p in item.nodeid for p in _PLANE_TESTS)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the group marks (its hook is not tryfirst)
def pytest_collection_modifyitems(config, items):
    items.sort(key=_on_plane)  # stable
    for item in items:
        item.add_marker(pytest.mark.xdist_group("plane" if _on_plane(item) else "main"))


def pytest_collection_finish(session):
    """Two planes on one host collide (ports, node names): if xdist did not group the lanes (it
    did not under pytest 9.2, whose nodeids ignore xdist's rewrite), stop before any test runs.
    """
    if not getattr(session.config.option, "loadgroup", False):
        return  # not an xdist worker under --dist loadgroup
    ungrouped = [i.nodeid for i in session.items if not i.nodeid.endswith(("@plane", "@main"))]
    if ungrouped:
        raise pytest.UsageError(
            f"--dist loadgroup did not group {len(ungrouped)} tests into the plane's and the main"
            f" lane (e.g. {ungrouped[0]}): pytest {pytest.__version__} with this pytest-xdist"
            " does not apply xdist_group marks; see pyproject.toml's dev extra"
        )


@pytest.fixture(autouse=True)
def _isolate_mlflow_globals():
    """``mlflow.set_tracking_uri/set_registry_uri`` also set ``MLFLOW_*_URI`` in ``os.environ``; a
    test that calls them (directly or through the CLI in-process) must not point later tests'
    subprocesses (torchrun trainers, ``dagster`` CLI runs) at its own store.
    """
    keys = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    saved = {k: os.environ.get(k) for k in keys}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if "mlflow" in sys.modules:
        from mlflow.tracking._model_registry import utils as registry_utils
        from mlflow.tracking._tracking_service import utils as tracking_utils

        tracking_utils._tracking_uri = None
        registry_utils._registry_uri = None
        _close_mlflow_engines()


def _close_mlflow_engines() -> None:
    """MLflow keeps one SQLAlchemy engine per database URI for the life of the process, with its
    pooled connections: each test's own ``mlflow.db`` held five descriptors to the session's end,
    and the session ran out of them in CI. Disposing an engine closes them; the engine still
    reconnects if anything uses it later.
    """
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engines = getattr(SqlAlchemyStore, "_engine_map", {})  # MLflow's private cache
    for uri in list(engines):
        engines.pop(uri).dispose()


@pytest.fixture(scope="session")
def arabic_reviews() -> Path:
    """Folder with PROD.csv, ATT.csv, RES2.csv (real, messy, read-only)."""
    if not SHARED_DATA.exists():
        pytest.skip("shared/data/arabic_reviews is not available")
    return SHARED_DATA


@pytest.fixture(scope="session")
def _tiny_model_session(tmp_path_factory) -> Path:
    from finetune_assets_tests.tiny_models import build_tiny_bert

    out = tmp_path_factory.mktemp("tiny-bert")
    build_tiny_bert(out)
    return out


@pytest.fixture
def tiny_model_dir(_tiny_model_session: Path, tmp_path: Path) -> Path:
    """A 2-layer, 32-wide BertForSequenceClassification folder (real WordPiece vocab), copied per
    test.
    """
    dst = tmp_path / "tiny-bert"
    shutil.copytree(_tiny_model_session, dst)
    return dst


@pytest.fixture
def open_dataset():
    """``StreamingDataset(**kwargs)`` for a test, released after it: streaming keeps every
    dataset's shared memory (six descriptors, six ``/dev/shm`` blocks) until the process exits, and
    the session would run out of descriptors.
    """
    from finetune_assets.core.shards.mds import open_streaming_dataset, release_streaming_dataset

    opened = []

    def open_(**kwargs):
        opened.append(open_streaming_dataset(**kwargs))
        return opened[-1]

    yield open_
    for dataset in opened:
        release_streaming_dataset(dataset)


@pytest.fixture
def postgres_url():
    """A fresh database on the test PostgreSQL server, dropped after the test (reruns and other
    tests never share run storage). Skipped without a server; in CI (``CI=true``) that fails.
    """
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    from finetune_assets_tests.chart_instance import POSTGRES_ENV

    server = os.environ.get(POSTGRES_ENV)
    if not server:
        why = f"{POSTGRES_ENV} is not set (source .ci/test_postgres.sh && start_test_postgres)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    import psycopg2

    name = f"test_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(server)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


@pytest.fixture
def storage_root(tmp_path: Path) -> Path:
    root = tmp_path / "storage"
    root.mkdir()
    return root


@pytest.fixture
def instance(tmp_path: Path):
    import dagster as dg

    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as inst:
        yield inst


def _real_rows(path: Path) -> list[tuple[str, str]]:
    """(text, class) of a shared Arabic file, classes by its README (1 / -1 / 0, ``1.0`` too), first
    spelling of each distinct text only, blank texts skipped.
    """
    import csv

    names = {"1": "Positive", "-1": "Negative", "0": "Mixed"}
    seen: set[str] = set()
    rows = []
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            text, raw = row["text"].strip(), row["polarity"].strip()
            label = names.get(raw[:-2] if raw.endswith(".0") else raw)
            if text and label and text not in seen:
                seen.add(text)
                rows.append((text, label))
    return rows


@pytest.fixture(scope="session")
def binary_reviews_tsv(arabic_reviews: Path, tmp_path_factory) -> Path:
    """A user's binary file written from real reviews: 150 Positive + 150 Negative of PROD.csv (its
    Mixed rows left out), one line each, labels written ``1`` / ``0`` as binary sets usually come.
    """
    rows = [
        (t, lab)
        for t, lab in _real_rows(arabic_reviews / "PROD.csv")
        if not any(c in t for c in '\t\n\r"')
    ]
    picked = [r for r in rows if r[1] == "Positive"][:150] + [
        r for r in rows if r[1] == "Negative"
    ][:150]
    out = tmp_path_factory.mktemp("binary") / "reviews_binary.tsv"
    lines = ["text\tlabel"] + [f"{t}\t{1 if lab == 'Positive' else 0}" for t, lab in sorted(picked)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def star_reviews_csv(arabic_reviews: Path, tmp_path_factory) -> Path:
    """A user's 1-5 star file written from real reviews of RES2.csv (title line, then body), columns
    ``Title``, ``Review Text``, ``stars``. The star values are NOT real ratings: they are derived
    from the real 3-class labels (Negative -> 1, 2, Mixed -> 3, Positive -> 4, 5, alternating in
    file order), because no real star-rated set may be committed. 80 Negative, 40 Mixed, 80
    Positive: 40 per star.
    """
    import csv

    rows = _real_rows(arabic_reviews / "RES2.csv")
    quota = {"Negative": 80, "Mixed": 40, "Positive": 80}
    stars = {"Negative": (1, 2), "Mixed": (3, 3), "Positive": (4, 5)}
    taken = dict.fromkeys(quota, 0)
    out = tmp_path_factory.mktemp("stars") / "reviews_stars.csv"
    with out.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Title", "Review Text", "stars"])
        for text, label in rows:
            if taken[label] < quota[label]:
                title, _, body = text.partition("\n")
                writer.writerow([title.strip(), body.strip(), stars[label][taken[label] % 2]])
                taken[label] += 1
    assert taken == quota, taken
    return out
