"""The documents that promise behaviour point at tests that exist, and CI runs what the README says."""

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


def test_readme_first_command_trains_on_the_real_default_set_and_ends_with_its_summary():
    from finetune_assets.data.builtin import DEFAULT_SOURCE, check_builtin

    readme = (REPO / "README.md").read_text()
    first = re.search(r"Materialize the whole graph on the defaults.*?```bash\n(.+?)\n```", readme, re.S).group(1)
    add = re.search(r"finetune-assets versions add (\S+) --source (\S+) &&", first)
    assert add, first
    key, source = add.groups()
    assert source == DEFAULT_SOURCE and source != "builtin:sample"  # real reviews, not the generated sentences
    check_builtin(source)  # a known set whose package is installed
    assert f"--select '*' --partition {key};" in first
    assert first.rstrip().endswith(f"finetune-assets summary {key}")
