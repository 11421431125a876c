"""The fan-out protocol: one command run once per slice index, locally or as Kubernetes pods (see TEAM.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class FanOut:
    name: str                 # unique per launch, DNS-1123 safe (<= 52 chars), e.g. "tok-<version>-<runid8>"
    command: list[str]        # run once per index; the index arrives as env JOB_COMPLETION_INDEX (as a k8s Indexed Job sets it)
    count: int                # indexes 0..count-1
    env: dict[str, str]       # extra environment (storage root, etc.)

class FanOutError(RuntimeError): ...   # message names the failed indexes and the last lines of their logs

class FanOutRunner(Protocol):
    def run(self, job: FanOut, log: Callable[[str], None]) -> None: ...
    # returns when every index succeeded; raises FanOutError otherwise; idempotent per index (a re-run index overwrites its own part)
