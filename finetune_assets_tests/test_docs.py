"""The documents that promise behaviour point at tests that exist, and CI runs what the README
says.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "finetune_assets_tests"


def _cited_tests(doc: Path) -> list[tuple[str, str]]:
    cited = re.findall(r"`([\w/]+\.py)::(test_\w+)", doc.read_text())
    assert cited, f"{doc} cites no tests"
    return cited


def test_every_test_the_reliability_table_cites_exists():
    missing = []
    for path, name in _cited_tests(REPO / "docs" / "reliability.md"):
        source = TESTS / path
        if not source.exists() or not re.search(rf"^\s*def {name}\(", source.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/reliability.md cites tests that do not exist: {missing}"


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    command = re.search(r"test command itself.*?`([^`]+)`", readme, re.S).group(1)
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines, f".ci/run does not run the README's test command {command!r}"


def test_the_github_workflow_runs_the_tests_and_materializes_what_the_readme_says():
    import yaml

    readme = (REPO / "README.md").read_text()
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    runs = "\n".join(step.get("run", "") for step in steps)
    assert any(step.get("uses", "").startswith("actions/checkout@") for step in steps)
    assert any(step.get("with", {}).get("python-version") == "3.11" for step in steps)
    command = re.search(r"test command itself.*?`([^`]+)`", readme, re.S).group(1)
    assert command in runs, f"the workflow does not run the README's test command {command!r}"
    assert "versions add sample --source builtin:sample" in runs
    assert (
        "dagster asset materialize -m finetune_assets.definitions --select '*' --partition sample"
        in runs
    )
    assert ".github/workflows/ci.yml" in readme  # the README says how to adapt it


def test_the_readme_shows_both_launch_commands():
    readme = (REPO / "README.md").read_text()
    assert (
        "dagster asset materialize -m finetune_assets.definitions --select '*' --partition "
        "rotten_tomatoes" in readme
    )
    assert (
        "dg launch -m finetune_assets.definitions --assets '*' --partition rotten_tomatoes"
        in readme
    )


def test_readme_first_command_trains_on_the_real_default_set_and_ends_with_its_summary():
    from finetune_assets.core.sources.builtin_sets import DEFAULT_SOURCE, check_builtin

    readme = (REPO / "README.md").read_text()
    first = re.search(r"Train on the defaults.*?```bash\n(.+?)\n```", readme, re.S).group(1)
    add = re.search(r"finetune-assets versions add (\S+) --source (\S+) &&", first)
    assert add, first
    key, source = add.groups()
    # real reviews, not the generated sentences
    assert source == DEFAULT_SOURCE and source != "builtin:sample"
    check_builtin(source)  # a known set whose package is installed
    assert f"--select '*' --partition {key};" in first
    assert first.rstrip().endswith(f"finetune-assets summary {key}")
