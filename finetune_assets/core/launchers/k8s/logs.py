"""Pod logs and Events: the Warning events of a gang, log tails and the index-0 follower."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

import kubernetes

from finetune_assets.core.launchers.base import log_trainer_line
from finetune_assets.core.launchers.k8s.constants import API_TIMEOUT_S, CONTAINER_NAME


def _warning_events(api, namespace: str, names: Sequence[str], limit: int = 8) -> str:
    """The Warning events of the Job and its pods (quota, admission, scheduling, image pulls,
    volumes).
    """
    # by reason *and* message: the kubelet records a failed pull as two "Failed" events ('Failed
    # to pull image "...": <why>', then "Error: ErrImagePull"); the first says why
    seen: dict[tuple[str, str, str], str] = {}
    for name in names:
        try:
            items = api.core_api.list_namespaced_event(
                namespace,
                field_selector=f"involvedObject.name={name}",
                _request_timeout=API_TIMEOUT_S,
            ).items
        except Exception as e:  # events are a diagnosis; never let them hide the outcome
            return f"<events unavailable: {e!r}>"
        for ev in items:
            if ev.type == "Warning":
                seen[(name, ev.reason or "", ev.message or "")] = (
                    f"{name}: {ev.reason}: {ev.message}"
                )
    return "; ".join(list(seen.values())[-limit:])


def _safe_logs(api, pod_name: str, namespace: str, tail_lines: int) -> str:
    try:
        return api.retrieve_pod_logs(
            pod_name, namespace, container_name=CONTAINER_NAME, tail_lines=tail_lines
        )
    except Exception as e:
        return f"<logs unavailable: {e!r}>"


class LogFollower:
    """Follows one pod's log at a time on a background thread; the caller drains lines into the
    run's log.

    Lines go through a queue so that only the launching thread touches the run's log. A stream
    that ends or breaks while the pod still runs (API server restart, kubelet hiccup, idle timeout
    of a proxy) is re-opened and the lines already delivered are skipped, so nothing repeats or goes
    missing (unless the kubelet rotated the log file in between, at 10 MiB by default).
    """

    def __init__(self, api, namespace: str, max_reconnects: int = 100):
        self._api = api
        self._ns = namespace
        self._lines: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._max_reconnects = max_reconnects
        self.pod: str | None = None

    def start(self, pod: str | None) -> None:
        """Follow ``pod``; a different pod (a retried index) once the previous stream has ended."""
        if pod is None or pod == self.pod or (self._thread is not None and self._thread.is_alive()):
            return
        self.pod = pod
        self._thread = threading.Thread(
            target=self._run, args=(pod,), name=f"logs-{pod}", daemon=True
        )
        self._thread.start()

    def _run(self, pod: str) -> None:
        delivered, failures = 0, 0
        while failures < self._max_reconnects:  # consecutive re-opens without a new line
            if self._stop.is_set():
                return
            buf, n, before = b"", 0, delivered
            try:
                response = self._api.core_api.read_namespaced_pod_log(
                    pod, self._ns, container=CONTAINER_NAME, follow=True, _preload_content=False
                )
                for chunk in response.stream(4096):
                    if self._stop.is_set():
                        return
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        n += 1
                        if n > delivered:
                            self._lines.put(f"[{pod}] " + line.decode("utf-8", "replace"))
                            delivered = n
                # a clean end of a finished container: flush the unterminated last line
                if self._finished(pod):
                    if buf and n + 1 > delivered:
                        self._lines.put(f"[{pod}] " + buf.decode("utf-8", "replace"))
                    return
            except kubernetes.client.ApiException as e:
                if e.status == 404:  # the pod is gone
                    return
            except Exception:
                if self._stop.is_set():
                    return
            failures = 0 if delivered > before else failures + 1
            # 400 (not started yet) or a broken stream: re-open
            time.sleep(min(5.0, 0.2 * (failures + 1)))
        self._lines.put(f"[{pod}] <log stream given up after {self._max_reconnects} reconnects>")

    def _finished(self, pod_name: str) -> bool:
        try:
            pod = self._api.core_api.read_namespaced_pod(
                pod_name, self._ns, _request_timeout=API_TIMEOUT_S
            )
        except kubernetes.client.ApiException as e:
            return e.status == 404
        except Exception:
            return False
        return bool(pod.status and pod.status.phase in ("Succeeded", "Failed"))

    def drain(self, log) -> None:
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            source, _, text = line.partition("] ")  # lines carry their pod: "[pod] text"
            log_trainer_line(log, text, source=source + "]")

    def wait(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def finish(self, pod: str | None, log, timeout: float = 30) -> None:
        """The gang completed: follow ``pod`` (pod 0) if not yet, read its log to the end (at
        most ``timeout`` s) and log every line still queued.
        """
        self.start(pod)
        self.wait(timeout=timeout)
        self.drain(log)

    def stop(self) -> None:
        """Stop following; the daemon thread ends when the (deleted) pod's log stream closes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
