"""The double's Job controller passes cases transcribed from Kubernetes' own controller tests."""

from __future__ import annotations

import pytest

from finetune_assets_tests.launchers.k8s.job_controller import MAX_INT32, Pod, backoff_limit, sync
from finetune_assets_tests.launchers.k8s.upstream_job_cases import CASES


@pytest.mark.parametrize("case", CASES, ids=[c["case"][:60] for c in CASES])
def test_upstream_job_controller_case(case: dict) -> None:
    pods = [Pod(name, index, phase, **extra) for name, index, phase, extra in case["pods"]]
    got = sync(case["spec"], pods)
    seen = {
        "conditions": got.conditions,
        "active": got.active,
        "failed": got.failed,
        "succeeded": got.succeeded,
        "terminating": got.terminating,
        "completed_indexes": got.completed_indexes,
        "failed_indexes": got.failed_indexes,
        "created": len(got.to_create),
        "deleted": len(got.to_delete),
    }
    assert {k: seen[k] for k in case["want"]} == case["want"], f"{case['test']}: {case['case']}"


def test_enough_upstream_cases_are_transcribed() -> None:
    assert len(CASES) >= 25 and len({c["case"] for c in CASES}) == len(CASES)


def test_backoff_limit_defaults_like_the_api_server() -> None:
    """pkg/apis/batch/v1/defaults.go: backoffLimit defaults to MaxInt32 with backoffLimitPerIndex,
    else 6.
    """
    assert backoff_limit({"backoffLimitPerIndex": 2}) == MAX_INT32
    assert backoff_limit({}) == 6
    # explicit wins: the fan-out bug
    assert backoff_limit({"backoffLimitPerIndex": 2, "backoffLimit": 0}) == 0


def test_the_cases_table_in_the_docs_lists_every_case() -> None:
    from pathlib import Path

    table = (
        Path(__file__).resolve().parents[3] / "docs" / "k8s-job-controller-cases.md"
    ).read_text()
    missing = [c["case"] for c in CASES if f"| {c['case']} |" not in table]
    assert not missing, f"docs/k8s-job-controller-cases.md lacks {missing} (regenerate its table)"
