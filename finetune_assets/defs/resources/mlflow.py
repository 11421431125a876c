"""MLflow as a typed resource: where runs are tracked, which registered model they feed, how to
link them.
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from finetune_assets.core.io.storage import Storage
from finetune_assets.core.io.tracking import (
    configured_uri,
    ensure_sqlite_store,
    run_url,
    tracking_uri,
    web_ui,
)

# The step-level retry for what talks to the registry (champion_model, quality_gate): an outage or a
# "database is locked" passes in seconds to minutes; a dg.Failure(allow_retries=False) (nothing to
# promote, no test data) is a result and is not retried. Run-level failures are the daemon's.
REGISTRY_RETRY = dg.RetryPolicy(
    max_retries=3, delay=10, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)


class MlflowResource(dg.ConfigurableResource):
    """Tracking store and model registry for ``finetuned_model``.

    With no ``tracking_uri`` (and no ``MLFLOW_TRACKING_URI``), an embedded SQLite store and artifact
    folder under a local storage root are used, so the default graph needs no server.
    """

    tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking URI; empty: $MLFLOW_TRACKING_URI or SQLite under the "
        "storage root",
    )
    experiment_name: str = Field(default="review-classifier")
    registered_model_name: str = Field(default="review-classifier")
    champion_alias: str = Field(
        default="champion", description="registered-model alias champion_model moves"
    )
    ui_base_url: str | None = Field(
        default=None,
        description="MLflow UI for links (default: the tracking URI when it is http(s))",
    )

    def resolve_tracking_uri(self, storage: Storage) -> str:
        return ensure_sqlite_store(
            tracking_uri(
                self.tracking_uri, storage.url("mlflow"), "set MlflowResource.tracking_uri"
            )
        )

    # MLflow is imported inside the methods that use it (``client_at``, ``experiment_id``,
    # ``outage_errors``), never at module level: it costs seconds, and every step process loads
    # the code location.

    def client(self, storage: Storage):
        """The client over this resource's store (the embedded one created on first use)."""
        return self.client_at(self.resolve_tracking_uri(storage))

    @staticmethod
    def client_at(uri: str):
        """The one way the code location (and the CLI) talks to MLflow: tracking and registry on
        the same store.
        """
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=uri, registry_uri=uri)

    def experiment_id(self, storage: Storage, client=None) -> str:
        """``experiment_name``'s id, created (with the storage root's artifact location) on first
        use; a concurrent creator (a trainer of another version) wins without failing us.
        """
        from mlflow.exceptions import MlflowException

        client = client or self.client(storage)
        exp = client.get_experiment_by_name(self.experiment_name)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(
                self.experiment_name, artifact_location=self.artifact_location(storage)
            )
        except MlflowException:  # created concurrently
            return client.get_experiment_by_name(self.experiment_name).experiment_id

    def create_run(self, storage: Storage, run_name: str, tags: dict[str, str]):
        """A run of the code location's own (a baseline fit, a study) in ``experiment_name``, and
        the client that made it.
        """
        client = self.client(storage)
        run = client.create_run(self.experiment_id(storage, client), run_name=run_name, tags=tags)
        return client, run

    @staticmethod
    def outage_errors() -> tuple[type[Exception], ...]:
        """What an unreachable or refusing tracking store raises. What the code location logs to
        MLflow itself catches these and warns: a published result never waits on the store.
        """
        from mlflow.exceptions import MlflowException

        return (MlflowException, OSError, ValueError)

    def artifact_location(self, storage: Storage) -> str | None:
        """Artifacts beside the embedded store; a tracking server decides for itself."""
        return None if configured_uri(self.tracking_uri) else storage.url("mlflow", "artifacts")

    def _ui(self) -> str | None:
        return web_ui(self.ui_base_url or configured_uri(self.tracking_uri))

    def run_url(self, experiment_id: str, run_id: str) -> str | None:
        return run_url(self._ui(), experiment_id, run_id)

    def model_version_url(self, name: str, version: int | str) -> str | None:
        ui = self._ui()
        return f"{ui}/#/models/{name}/versions/{version}" if ui else None
