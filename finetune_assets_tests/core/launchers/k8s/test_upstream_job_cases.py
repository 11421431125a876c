"""The table of cases transcribed from Kubernetes' own Job-controller tests (no cluster): complete,
and listed in the docs. The real Job controller plays them in test_upstream_job_cases_on_plane.py.
"""

from __future__ import annotations

from finetune_assets_tests.core.launchers.k8s.upstream_job_cases import CASES


def test_enough_upstream_cases_are_transcribed() -> None:
    assert len(CASES) >= 25 and len({c["case"] for c in CASES}) == len(CASES)


def test_the_cases_table_in_the_docs_lists_every_case() -> None:
    from pathlib import Path

    table = (
        Path(__file__).resolve().parents[4] / "docs" / "k8s-job-controller-cases.md"
    ).read_text()
    missing = [c["case"] for c in CASES if f"| {c['case']} |" not in table]
    assert not missing, f"docs/k8s-job-controller-cases.md lacks {missing} (regenerate its table)"
