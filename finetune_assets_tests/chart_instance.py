"""The Dagster instance the Helm chart deploys, for the tests that run a real daemon: the repo's
``deploy/instance/dagster.yaml`` with the storage block the chart renders for its PostgreSQL
(``dagsterYaml.postgresql.config`` in ``deploy/values.yaml``, driver scheme included).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parents[1]
INSTANCE_FILE = REPO / "deploy" / "instance" / "dagster.yaml"
VALUES_FILE = REPO / "deploy" / "values.yaml"
POSTGRES_ENV = "FINETUNE_TEST_POSTGRES_URL"  # the test server; .ci/test_postgres.sh starts one


def instance_settings(db_url: str) -> dict:
    """``dagster.yaml`` as deployed, its run, event and schedule storage in ``db_url``."""
    settings = yaml.safe_load(INSTANCE_FILE.read_text())
    url = urlsplit(db_url)
    chart = yaml.safe_load(VALUES_FILE.read_text())["postgresql"]
    settings["storage"] = {
        "postgres": {
            "postgres_db": {
                "username": url.username,
                "password": url.password or "",
                "hostname": url.hostname,
                "port": url.port,
                "db_name": url.path.lstrip("/"),
                "scheme": chart["postgresqlScheme"],
            }
        }
    }
    return settings
