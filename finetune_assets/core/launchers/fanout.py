"""Fan-out: one command run once per index (0..count-1), as a Kubernetes Indexed Job runs its pods.

The protocol (``FanOut``, ``FanOutRunner``, ``FanOutError``) is shared by the local runner below and
the Kubernetes runner (``core/launchers/k8s/fanout.py``): the index arrives as env
``JOB_COMPLETION_INDEX`` exactly as an Indexed Job sets it, and workers read and write only through
storage URLs, so switching runners changes where the processes run, never what they compute.
Dagster-free (the data workers import it).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

INDEX_ENV = "JOB_COMPLETION_INDEX"
TAIL_LINES = 20  # last log lines of each failed index quoted in FanOutError


@dataclass(frozen=True)
class FanOut:
    name: str  # unique per launch, DNS-1123 safe (<= 52 chars), e.g. "tok-<version>-<runid8>"
    command: list[str]  # run once per index; the index arrives as env JOB_COMPLETION_INDEX
    count: int  # indexes 0..count-1
    env: dict[str, str]  # extra environment (storage root, etc.)


class FanOutError(RuntimeError):
    """Some indexes failed: the message names them and quotes the last lines of their logs."""

    def __init__(self, message: str, failed: dict[int, tuple[int, list[str]]] | None = None):
        super().__init__(message)
        # index -> (exit code, last log lines), where the runner knows them
        self.failed = failed or {}

    @classmethod
    def of(cls, name: str, failed: dict[int, tuple[int, list[str]]]) -> FanOutError:
        parts = [
            f"{name}: index {i} exited {code}:\n" + "\n".join(f"    {ln}" for ln in tail)
            for i, (code, tail) in sorted(failed.items())
        ]
        return cls(
            f"{len(failed)} of the fan-out's indexes failed ({sorted(failed)}):\n"
            + "\n".join(parts),
            failed,
        )


def runner_width(runner: FanOutRunner) -> int | None:
    """How many indexes a runner runs at once (``workers`` / ``parallelism``), None when
    unbounded or unknown.
    """
    for attr in ("workers", "parallelism"):
        value = getattr(runner, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


class FanOutRunner(Protocol):
    def run(self, job: FanOut, log: Callable[[str], None]) -> None:
        """Return when every index succeeded; raise FanOutError otherwise. A re-run index
        overwrites its own part.
        """
        ...


def usable_cores() -> int:
    """Cores this process may run on (cgroup/affinity aware where the OS says), not the host's
    count.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)


@dataclass
class LocalFanOutRunner:
    """The indexes as subprocesses of this process, at most ``workers`` at a time.

    Each line a worker prints is forwarded to ``log`` prefixed with ``[index]``. After the first
    failure no new index starts (the running ones finish), and FanOutError names every failed index.
    """

    workers: int = field(default_factory=usable_cores)
    python: str | None = None  # interpreter for each worker (the launcher's); default: this one

    def run(self, job: FanOut, log: Callable[[str], None]) -> None:
        if job.count < 0 or self.workers < 1:
            raise ValueError(
                f"{job.name}: count must be >= 0 and workers >= 1 (got {job.count}, {self.workers})"
            )
        pending = collections.deque(range(job.count))
        running: dict[int, tuple[subprocess.Popen, threading.Thread, collections.deque]] = {}
        failed: dict[int, tuple[int, list[str]]] = {}
        lock = threading.Lock()

        def pump(index: int, proc: subprocess.Popen, tail: collections.deque) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                with lock:
                    log(f"[{index}] {line}")

        try:
            while pending or running:
                while pending and len(running) < self.workers and not failed:
                    index = pending.popleft()
                    env = {**os.environ, **job.env, INDEX_ENV: str(index)}
                    command = list(job.command)
                    if self.python and command[:1] == [sys.executable]:
                        command[0] = self.python
                    proc = subprocess.Popen(
                        command,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        errors="replace",
                        start_new_session=True,
                    )
                    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
                    thread = threading.Thread(target=pump, args=(index, proc, tail), daemon=True)
                    thread.start()
                    running[index] = (proc, thread, tail)
                if failed and not running:
                    break
                done = self._wait_any(running)
                proc, thread, tail = running.pop(done)
                thread.join()
                if proc.returncode != 0:
                    failed[done] = (proc.returncode, list(tail))
        except BaseException:  # cancelled (or a bug here): no orphaned workers
            for proc, _, _ in running.values():
                _kill(proc)
            raise
        if failed:
            raise FanOutError.of(job.name, failed)

    @staticmethod
    def _wait_any(running: dict) -> int:
        """The index of a finished worker (polls: Popen offers no wait-for-any across processes)."""
        import time

        while True:
            for index, (proc, _, _) in running.items():
                if proc.poll() is not None:
                    return index
            time.sleep(0.05)


def _kill(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def python_module(module: str, *args: str) -> list[str]:
    """``python -m module args``, with this interpreter (the same venv / image as the caller)."""
    return [sys.executable, "-m", module, *args]
