"""The Kubernetes API client of the launcher."""

from __future__ import annotations

import kubernetes


class ApiMixin:
    def api(self):
        """A ``DagsterKubernetesClient`` on a private client configuration (no global state)."""
        from dagster_k8s.client import DagsterKubernetesClient, PatchedApiClient

        configuration = kubernetes.client.Configuration()
        if self.load_incluster_config:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(
                config_file=self.kubeconfig_file, context=self.kube_context, client_configuration=configuration
            )
        api_client = PatchedApiClient(configuration=configuration)
        return DagsterKubernetesClient.production_client(
            batch_api_override=kubernetes.client.BatchV1Api(api_client),
            core_api_override=kubernetes.client.CoreV1Api(api_client),
        )

