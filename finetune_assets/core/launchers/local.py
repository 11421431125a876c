"""Run torchrun as a subprocess on this machine, stream its log into the run's, kill its process
group on cancel.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
from collections import deque
from pathlib import Path

import psutil

from finetune_assets.core.launchers.base import (
    Log,
    RunContext,
    TrainingFailed,
    TrainingSpec,
    log_trainer_line,
    torchrun_command,
)

TAIL_LINES = 40


def _error_from_files(error_dir: Path) -> str | None:
    """The first worker error torchrun's ``@record`` wrote (message + traceback), if any."""
    for path in sorted(error_dir.rglob("error.json")):
        try:
            message = json.loads(path.read_text()).get("message", {})
        except (OSError, ValueError):
            continue
        if isinstance(message, dict):
            text = message.get("message", "")
            trace = message.get("extraInfo", {}).get("py_callstack", "")
            lines = trace.strip().splitlines()[-15:] if trace else []
            return "\n".join([text, *lines]).strip() or None
        if message:
            return str(message)
    return None


def process_tree(pid: int) -> dict[int, int]:
    """``pid`` and all its descendants, each with its process group.

    torchrun starts every worker in a new session (its own process group), so killing torchrun's
    group alone would orphan the workers; the tree is captured before anything is signalled.
    """
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    tree = {}
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            tree[proc.pid] = os.getpgid(proc.pid)
    return tree


def _alive_in_group(pid: int, pgid: int) -> bool:
    try:
        return psutil.Process(pid).is_running() and os.getpgid(pid) == pgid
    except (psutil.NoSuchProcess, ProcessLookupError):
        return False


def kill_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM torchrun (it stops its workers), then SIGKILL every process group of the tree that
    is left.
    """
    tree = process_tree(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pgid in sorted(set(tree.values())):
        if any(_alive_in_group(pid, g) for pid, g in tree.items() if g == pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class LocalTorchrun:
    """``torchrun --standalone --nproc-per-node N`` on this machine (CPU with gloo, or local
    GPUs). Its fields (``nproc_per_node``, ``max_restarts``, ``python``, ``cwd``,
    ``omp_num_threads``) are the ``launcher`` resource's (``defs/resources/launchers.py``).
    """

    def command(self, job: TrainingSpec) -> list[str]:
        return torchrun_command(
            job.config_url,
            nproc_per_node=self.nproc_per_node,
            max_restarts=self.max_restarts,
            python=self.python,
        )

    def train(self, ctx: RunContext, job: TrainingSpec) -> None:
        """Run ``job`` to completion or raise :class:`TrainingFailed`; an interruption (Dagster's
        termination, Ctrl-C) kills every process of the run before it propagates.
        """
        log = ctx.log
        cmd = self.command(job)
        with tempfile.TemporaryDirectory(prefix=f"{job.name[:40]}-") as tmp:
            error_dir = Path(tmp)
            env = {**os.environ, **job.env}
            env["TORCHELASTIC_ERROR_FILE"] = str(error_dir / "error.json")
            env.setdefault("PYTHONUNBUFFERED", "1")
            threads = self.omp_num_threads or max(1, (os.cpu_count() or 1) // self.nproc_per_node)
            env.setdefault("OMP_NUM_THREADS", str(threads))
            log.info(f"launching {job.name}: {' '.join(cmd)}")
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # own process group: cancellation kills workers too
                text=True,
                bufsize=1,
            )
            tail: deque[str] = deque(maxlen=TAIL_LINES)
            lines: queue.Queue[str] = queue.Queue()
            try:
                reader = threading.Thread(target=self._pump, args=(proc, lines), daemon=True)
                reader.start()
                while proc.poll() is None or reader.is_alive():
                    self._drain(lines, log, tail, timeout=0.2)
                    if proc.poll() is not None:
                        reader.join(timeout=10)
                self._drain(lines, log, tail, timeout=0)
            # Dagster termination (DagsterExecutionInterruptedError), Ctrl-C, ...
            except BaseException:
                log.warning(f"{job.name}: interrupted, killing the torchrun process group")
                kill_process_group(proc)
                raise
            if proc.returncode != 0:
                detail = _error_from_files(error_dir) or "\n".join(tail)
                raise TrainingFailed(
                    f"training job {job.name} failed (torchrun exit code "
                    f"{proc.returncode}):\n{detail}"
                )
            log.info(f"{job.name}: training finished")

    @staticmethod
    def _pump(proc: subprocess.Popen, lines: queue.Queue[str]) -> None:
        # Reads in a thread so the main thread stays responsive to an interrupt (Dagster's).
        for line in proc.stdout or ():
            if line.strip():
                lines.put(line.rstrip())

    @staticmethod
    def _drain(lines: queue.Queue[str], log: Log, tail: deque[str], timeout: float) -> None:
        try:
            line = lines.get(timeout=timeout) if timeout else lines.get_nowait()
            while True:
                tail.append(line)
                log_trainer_line(log, line)
                line = lines.get_nowait()
        except queue.Empty:
            return
