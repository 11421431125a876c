"""The launcher's Kubernetes API client: every read, write and stream through one retrying wrapper.

A 24-hour training must not end because the API server said 429 once (API priority and fairness),
restarted (5xx, connection reset) or briefly rejected a token (the transient 401 EKS is known for).
Each call gets a request timeout and is retried with back-off (``Retry-After`` honoured) until the
launcher's outage budget (``api_outage_budget_s``) is spent; only then does :class:`ApiOutage`
escape. Errors that retrying cannot fix (400, 403, 404, 409, 422) are raised at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3

from finetune_assets.core.launchers.k8s.constants import API_TIMEOUT_S

RETRIED_STATUS = {401, 408, 429, 500, 502, 503, 504}
FIRST_DELAY_S, MAX_DELAY_S = 0.5, 10.0


class ApiOutage(RuntimeError):
    """The API server stayed unreachable (or kept refusing) for longer than the outage budget."""


def retry_after(error: kubernetes.client.ApiException) -> float | None:
    """The server's ``Retry-After`` (seconds), if it sent one."""
    value = (error.headers or {}).get("Retry-After") if error.headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def call(
    fn: Callable[..., Any], *args: Any, budget_s: float, what: str, log=None, **kwargs: Any
) -> Any:
    """``fn(*args, **kwargs)`` with a request timeout; 429/5xx/401/connection errors are retried
    within ``budget_s``.
    """
    if not kwargs.get("follow"):  # a followed log stream is quiet for minutes: no read timeout
        kwargs.setdefault("_request_timeout", API_TIMEOUT_S)
    deadline, delay, attempt = time.monotonic() + budget_s, FIRST_DELAY_S, 0
    while True:
        attempt += 1
        try:
            return fn(*args, **kwargs)
        except kubernetes.client.ApiException as e:
            if e.status == 409 and attempt > 1 and what.startswith("create"):
                return None  # an earlier attempt got through before its answer was lost
            if e.status not in RETRIED_STATUS:
                raise
            error, wait = f"{e.status} {e.reason}", retry_after(e) or delay
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as e:
            error, wait = repr(e), delay
        if time.monotonic() + wait > deadline:
            raise ApiOutage(
                f"Kubernetes API: {what} failed for {budget_s:.0f}s (api_outage_budget_s), "
                f"{attempt} attempt(s); last: {error}"
            ) from None
        if log is not None and (attempt in (1, 5) or attempt % 20 == 0):
            log.warning(f"Kubernetes API: {what}: {error}; retrying (attempt {attempt})")
        time.sleep(wait)
        delay = min(MAX_DELAY_S, delay * 2)


class _Retrying:
    """A ``CoreV1Api`` / ``BatchV1Api`` whose every method goes through :func:`call`."""

    def __init__(self, api: Any, budget_s: float, log=None):
        self._api, self._budget_s, self._log = api, budget_s, log
        self._owner = threading.get_ident()  # only the launching thread writes to the run's log

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if not callable(method) or name.startswith("_") or name == "api_client":
            return method
        what = name.replace("_namespaced_", " ").replace("_", " ")

        def retried(*args: Any, **kwargs: Any) -> Any:
            log = self._log if threading.get_ident() == self._owner else None
            return call(method, *args, budget_s=self._budget_s, what=what, log=log, **kwargs)

        return retried


@dataclass(frozen=True)
class Api:
    """The launcher's API handles, each retrying through :func:`call`."""

    core_api: Any
    batch_api: Any
    custom_api: Any  # JobSets, and Kueue's Workloads (read on preemption, deactivated to stop)

    def retrieve_pod_logs(
        self, pod_name: str, namespace: str, container_name: str | None = None, **kwargs: Any
    ) -> str:
        """A pod's log as text (unparsed: the client would turn a log that looks like JSON into a
        dict and back into a string that is not).
        """
        return self.core_api.read_namespaced_pod_log(
            name=pod_name,
            namespace=namespace,
            container=container_name,
            _preload_content=False,
            **kwargs,
        ).data.decode("utf-8")


class ApiMixin:
    def api(self, log=None) -> Api:
        """:class:`Api` on a private client configuration (no global state), its every call
        retried through :func:`call`.
        """
        configuration = kubernetes.client.Configuration()
        if self.load_incluster_config:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(
                config_file=self.kubeconfig_file,
                context=self.kube_context,
                client_configuration=configuration,
            )
        # the pinned client (36) hands this configuration to every model it deserializes: no lock
        # contention per model (kubernetes-client/python#2284, what dagster-k8s's PatchedApiClient
        # patched in)
        api_client = kubernetes.client.ApiClient(configuration=configuration)
        budget = self.api_outage_budget_s
        return Api(
            core_api=_Retrying(kubernetes.client.CoreV1Api(api_client), budget, log),
            batch_api=_Retrying(kubernetes.client.BatchV1Api(api_client), budget, log),
            custom_api=_Retrying(kubernetes.client.CustomObjectsApi(api_client), budget, log),
        )
