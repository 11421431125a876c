"""MLflow as a typed resource: where runs are tracked, which registered model they feed, how to link them."""

from __future__ import annotations

import os

import dagster as dg
from pydantic import Field

from finetune_assets.storage import Storage


class MlflowResource(dg.ConfigurableResource):
    """Tracking store and model registry for ``finetuned_model``.

    With no ``tracking_uri`` (and no ``MLFLOW_TRACKING_URI``), an embedded SQLite store and artifact
    folder under a local storage root are used, so the default graph needs no server.
    """

    tracking_uri: str | None = Field(
        default=None, description="MLflow tracking URI; empty: $MLFLOW_TRACKING_URI or SQLite under the storage root"
    )
    experiment_name: str = Field(default="review-classifier")
    registered_model_name: str = Field(default="review-classifier")
    champion_alias: str = Field(default="champion", description="registered-model alias champion_model moves")
    ui_base_url: str | None = Field(
        default=None, description="MLflow UI for links (default: the tracking URI when it is http(s))"
    )

    def resolve_tracking_uri(self, storage: Storage) -> str:
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri:
            return uri
        if not storage.is_local:
            raise ValueError(
                f"storage root {storage.root} is remote: set MlflowResource.tracking_uri (an embedded "
                "SQLite store needs a local root)"
            )
        return f"sqlite:///{storage.url('mlflow', 'mlflow.db')}"

    def artifact_location(self, storage: Storage) -> str | None:
        """Artifacts beside the embedded store; a tracking server decides for itself."""
        if self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"):
            return None
        return storage.url("mlflow", "artifacts")

    def _ui(self) -> str | None:
        base = self.ui_base_url or self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if base and base.startswith(("http://", "https://")) and "@" not in base.split("//", 1)[1].split("/", 1)[0]:
            return base.rstrip("/")
        return None

    def run_url(self, experiment_id: str, run_id: str) -> str | None:
        ui = self._ui()
        return f"{ui}/#/experiments/{experiment_id}/runs/{run_id}" if ui else None

    def model_version_url(self, name: str, version: int | str) -> str | None:
        ui = self._ui()
        return f"{ui}/#/models/{name}/versions/{version}" if ui else None
