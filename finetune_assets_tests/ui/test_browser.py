"""The Dagster UI in a real browser: `dagster dev` on loopback, driven by headless Chromium.

What a user does first: open the asset graph and see every asset, open a dataset-version
partition, materialize it from the UI, and see the run succeed and the metadata (with pictures).
Screenshots go to ``$FINETUNE_ASSETS_TEST_ARTIFACTS/ui`` (default ``<repo>/test-artifacts/ui``).

Chromium is Debian's package (``apt-get install -y chromium``) driven by Playwright for Python;
``playwright install`` is never needed. Skips with the reason when Chromium is absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = "sample"
DATA_ASSETS = ("raw_reviews", "pretrained_model", "tokenized_reviews", "mds_shards")
ALL_ASSETS = (*DATA_ASSETS, "finetuned_model")
CHAMPION_NAME = "review-classifier"
UI_GROUP = "reviews"  # raw_reviews, tokenized_reviews, mds_shards: what the UI run materializes
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
SERVER_START_S = 240
RUN_FINISH_S = 420

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def chromium_path() -> str | None:
    for candidate in (
        os.environ.get("CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def artifacts_dir() -> Path:
    out = Path(os.environ.get("FINETUNE_ASSETS_TEST_ARTIFACTS", REPO / "test-artifacts")) / "ui"
    out.mkdir(parents=True, exist_ok=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOCATIONS_QUERY = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


class Dagster:
    """`dagster dev` (webserver + daemon) as the README starts it, on a loopback port."""

    target_args: tuple[
        str, ...
    ] = ()  # empty: workspace.yaml in the repository root, as the README says

    def __init__(self, home: Path, root: Path, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "FINETUNE_ASSETS_ROOT": str(root),
            "HF_HUB_OFFLINE": "1",
            "DAGSTER_DISABLE_TELEMETRY": "1",
        }
        env.pop("MLFLOW_TRACKING_URI", None)
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dagster"),
                "dev",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                *self.target_args,
            ],
            cwd=REPO,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(
            f"{self.url}/graphql", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            payload = json.loads(resp.read())
        if payload.get("errors"):
            raise RuntimeError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_ready(self) -> list[str]:
        """Block until the code location is loaded; return the asset names the webserver serves."""
        deadline = time.monotonic() + SERVER_START_S
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"dagster dev exited with {self.proc.returncode}:\n{self.tail()}"
                )
            try:
                entries = self.graphql(LOCATIONS_QUERY)["workspaceOrError"]["locationEntries"]
            except OSError as err:  # not listening yet
                last = err
            else:
                for entry in entries:
                    error = entry["locationOrLoadError"] or {}
                    if error.get("__typename") == "PythonError":
                        raise RuntimeError(
                            f"code location {entry['name']} failed to load: {error['message']}"
                        )
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    nodes = self.graphql("{ assetNodes { assetKey { path } } }")["assetNodes"]
                    return ["/".join(n["assetKey"]["path"]) for n in nodes]
            time.sleep(1)
        raise RuntimeError(
            f"dagster dev not ready after {SERVER_START_S}s ({last}):\n{self.tail()}"
        )

    def runs(self) -> list[dict]:
        data = self.graphql(
            "{ runsOrError { ... on Runs { results { runId status tags { key value } "
            "assetSelection { path } } } } }"
        )
        return data["runsOrError"]["results"]

    def wait_run(self, run_id: str) -> str:
        deadline = time.monotonic() + RUN_FINISH_S
        while time.monotonic() < deadline:
            status = next(r["status"] for r in self.runs() if r["runId"] == run_id)
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                return status
            time.sleep(2)
        raise RuntimeError(f"run {run_id} did not finish in {RUN_FINISH_S}s:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            # dagster dev shuts down its webserver + daemon on SIGINT
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log_file.close()


@pytest.fixture
def prepared(tmp_path: Path, tiny_model_dir: Path, monkeypatch):
    """A registered version and a tiny pretrained_model, so the UI run takes seconds, not
    minutes.
    """
    import dagster as dg

    from finetune_assets.core.io.storage import Storage
    from finetune_assets.core.sources import SourceSpec
    from finetune_assets.defs.data.pretrained import pretrained_model
    from finetune_assets.defs.resources.storage_root import StorageResource
    from finetune_assets.defs.versions.register import register_version

    home, root = tmp_path / "dagster_home", tmp_path / "root"
    home.mkdir()
    # No asset daemon: its first tick (seconds after `dagster dev` starts) would build the
    # registered version by automation, racing the walk-through's own launch from the UI (seen:
    # the partition no longer missing, the launch dialog a backfill).
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nauto_materialize:\n  enabled: false\n  use_sensors: false\n"
    )
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as instance:
        register_version(instance, Storage(str(root)), VERSION, SourceSpec(uri="builtin:sample"))
        result = dg.materialize(
            [pretrained_model],
            instance=instance,
            resources={"storage": StorageResource(root=str(root))},
            run_config={"ops": {"pretrained_model": {"config": {"source": str(tiny_model_dir)}}}},
        )
        assert result.success
        report_a_champion(instance, root, tiny_model_dir)
    return home, root


def report_a_champion(instance, root: Path, model_dir: Path) -> None:
    """A registered model holding the champion alias in the root's own MLflow registry, reported as
    ``champion_model`` reports it (``champion_report``), so the UI shows the real asset's page.
    """
    from mlflow import MlflowClient

    from finetune_assets.core.evaluation import gate_rules as gate
    from finetune_assets.core.io.storage import Storage
    from finetune_assets.defs.promotion.champion import TAG_CHAMPION_SINCE, champion_report
    from finetune_assets.defs.resources.mlflow import MlflowResource

    uri = MlflowResource().resolve_tracking_uri(Storage(str(root)))
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(CHAMPION_NAME)
    mv = client.create_model_version(CHAMPION_NAME, source=str(model_dir))
    for key, value in {
        "dataset_version": VERSION,
        gate.TAG_SCORE: "0.8125",
        TAG_CHAMPION_SINCE: "2026-12-01 09:30:00+00:00",
    }.items():
        client.set_model_version_tag(CHAMPION_NAME, mv.version, key, value)
    client.set_registered_model_alias(CHAMPION_NAME, "champion", mv.version)
    instance.report_runless_asset_event(
        champion_report(client, "champion", CHAMPION_NAME, mv.version)
    )


@pytest.fixture
def dagster_dev(prepared, tmp_path: Path):
    home, root = prepared
    server = Dagster(home, root, artifacts_dir() / "dagster-dev.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def page():
    exe = chromium_path()
    if exe is None:
        pytest.skip(
            "Chromium is not installed (CI: apt-get install -y chromium); set CHROMIUM=/path to "
            "override"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright (python) is not installed"
    )
    import tempfile

    with (
        tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile,
        sync_api.sync_playwright() as pw,
    ):
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=exe,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 1000},
        )
        context.set_default_timeout(60_000)
        # The first visit greets with a "Join the Dagster community" dialog; mark it as seen, as
        # Skip would.
        context.add_init_script("window.localStorage.setItem('communityNux', '\"1\"')")
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def shot(page, name: str) -> Path:
    path = artifacts_dir() / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path


def test_asset_graph_partition_and_materialization_in_the_browser(dagster_dev, page):
    for old in artifacts_dir().glob("*.png"):  # screenshots of an earlier run would mislead
        old.unlink()
    try:
        walk_through_the_ui(dagster_dev, page)
    except BaseException:
        # what the browser showed: the most useful artifact when CI fails
        shot(page, "FAILED-last-page")
        raise


def walk_through_the_ui(dagster_dev: Dagster, page) -> None:
    from playwright.sync_api import expect

    from finetune_assets.definitions import build_defs

    served = dagster_dev.wait_ready()
    groups = {
        n["assetKey"]["path"][-1]: n["groupName"]
        for n in dagster_dev.graphql("{ assetNodes { assetKey { path } groupName } }")["assetNodes"]
    }
    location = dagster_dev.graphql(LOCATIONS_QUERY)["workspaceOrError"]["locationEntries"][0][
        "name"
    ]
    defined = {k.to_user_string() for k in build_defs().resolve_all_asset_keys()}
    assert set(DATA_ASSETS) <= defined
    expected = [a for a in ALL_ASSETS if a in defined]  # finetuned_model joins once it is defined
    assert set(expected) <= set(served)
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))

    # 1. The global asset graph shows every asset (groups start collapsed: open each one, as a user
    #    would).
    page.goto(f"{dagster_dev.url}/asset-groups")
    for group in sorted({groups[name] for name in expected}):
        members = [n for n in expected if groups[n] == group]
        page.get_by_text(group, exact=True).last.wait_for(state="visible")
        # the graph renders only the nodes in view: any member shows the group is open
        any_member = page.get_by_text(re.compile("^(" + "|".join(map(re.escape, members)) + ")$"))
        if not any_member.first.is_visible():
            page.get_by_text(group, exact=True).last.click()  # the group node in the graph
            any_member.first.wait_for(state="visible")
    page.reload()  # the open groups are remembered; a reload fits the whole graph into view
    for name in expected:
        page.get_by_text(name, exact=True).first.wait_for(state="visible")
    # node statuses filled in
    expect(page.get_by_text(re.compile(r"^Loading"))).to_have_count(0, timeout=60_000)
    shot(page, "01-asset-graph")

    # 2. A dataset-version partition of raw_reviews: registered, not yet materialized.
    page.goto(f"{dagster_dev.url}/assets/raw_reviews?view=partitions")
    page.get_by_text(VERSION, exact=True).first.click()
    page.get_by_text("Missing", exact=False).first.wait_for(state="visible")
    shot(page, "02-partition-before")

    # 3. Materialize the reviews group for that partition from the UI.
    before = {r["runId"] for r in dagster_dev.runs()}
    page.goto(f"{dagster_dev.url}/locations/{location}/asset-groups/{UI_GROUP}")
    for name in ("raw_reviews", "tokenized_reviews", "mds_shards"):
        page.get_by_text(name, exact=True).first.wait_for(state="visible")
    page.get_by_role("button", name="Materialize all").click()
    # Blueprint renders the dialog in a portal: locate by text on the page, not inside role=dialog.
    title = page.get_by_text("Launch runs to materialize 3 assets")
    title.wait_for(state="visible")
    page.get_by_role("button", name="Custom", exact=True).click()
    launch = page.get_by_role("button", name="Launch 1 run")
    try:  # the missing partition is usually preselected ...
        launch.wait_for(state="visible", timeout=5_000)
    except Exception:  # noqa: BLE001 - ... otherwise pick it, as a user would
        page.get_by_text("Select a partition or create one").click()
        page.keyboard.type(VERSION)
        # the picker lists partitions with checkboxes (Dagster 1.13), beside "Select all (1)"
        page.get_by_role("checkbox").locator("..").filter(
            has_text=re.compile(rf"^\s*{re.escape(VERSION)}\s*$")
        ).first.click()
        title.click()  # close the partition picker
        launch.wait_for(state="visible")
    page.get_by_text("1 partition", exact=True).first.wait_for(state="visible")
    shot(page, "03-launch-dialog")
    launch.click()

    deadline = time.monotonic() + 60
    new = []
    while not new and time.monotonic() < deadline:
        new = [r for r in dagster_dev.runs() if r["runId"] not in before]
        time.sleep(1)
    assert len(new) == 1, f"the UI launched {len(new)} runs"
    run = new[0]
    assert {t["key"]: t["value"] for t in run["tags"]}.get("dagster/partition") == VERSION
    assert sorted("/".join(a["path"]) for a in run["assetSelection"]) == [
        "mds_shards",
        "raw_reviews",
        "tokenized_reviews",
    ]
    status = dagster_dev.wait_run(run["runId"])
    assert status == "SUCCESS", dagster_dev.tail()

    # 4. The UI shows the successful run ...
    page.goto(f"{dagster_dev.url}/runs/{run['runId']}")
    page.get_by_text("Success", exact=True).first.wait_for(state="visible")
    page.get_by_text("RUN_SUCCESS").first.wait_for(state="visible")
    shot(page, "04-run-success")

    # 5. ... and the partition's metadata, including the label distribution picture.
    page.goto(f"{dagster_dev.url}/assets/raw_reviews?view=partitions&partition={VERSION}")
    page.get_by_text("label_distribution", exact=True).first.wait_for(state="visible")
    shot(page, "05-partition-metadata")
    # Long Markdown (an inline picture) sits behind a link that opens it in a dialog.
    row = page.locator("tr").filter(has=page.get_by_text("label_distribution_chart", exact=True))
    row.get_by_text("Show Markdown").click()
    chart = page.locator("img[src^='data:image/png;base64,']").first
    chart.wait_for(state="visible")
    page.wait_for_function(
        "img => img.complete && img.naturalWidth > 100", arg=chart.element_handle()
    )
    shot(page, "06-label-distribution-chart")

    # 6. The current champion, without choosing a partition: the unpartitioned champion asset.
    page.goto(f"{dagster_dev.url}/assets/champion")
    page.get_by_text("champions", exact=True).first.wait_for(state="visible")
    row = page.locator("tr").filter(has=page.get_by_text("champions", exact=True))
    if row.get_by_text("Show Markdown").count():  # long Markdown opens in a dialog
        row.get_by_text("Show Markdown").click()
    table = page.locator("table").filter(has_text="dataset version").last
    for cell in (CHAMPION_NAME, "v1", VERSION, "0.8125", "2026-12-01 09:30:00+00:00"):
        table.get_by_text(cell, exact=True).first.wait_for(state="visible")
    shot(page, "07-champion")
    assert not errors, f"page errors: {errors}"
