"""The performance tables of README.md and docs/performance.md are what bench.report generates from
the committed results, so they cannot drift from the runs they quote."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parents[2]


def _shallow() -> bool:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--is-shallow-repository"],
            check=False,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return True
    return out.returncode != 0 or out.stdout.strip() == "true"


@pytest.mark.processes  # runs git for each result's date
@pytest.mark.skipif(
    _shallow(), reason="the tables' dates come from the result files' commits: needs git history"
)
@pytest.mark.parametrize("page", sorted({page for page, _, _ in report.TABLES}))
def test_the_page_tables_are_what_the_results_give(page: str) -> None:
    text = (ROOT / page).read_text()
    assert report.render(page, text) == text, "run `python -m bench.report` (and commit the results first)"


def test_every_cited_result_exists_and_is_a_full_run() -> None:
    cited = {row.source for row in report.readme_rows()}
    assert {"machinery_zen4_3.json", "engine_reference_amx7.json", "worker_memory_zen4.json"} <= cited
    for name in cited:
        for run in report.runs_of(json.loads((report.RESULTS / name).read_text())):
            assert run.get("quick") is not True and "machine" in run, name


def test_a_ratio_is_the_median_of_each_runs_ratio_with_their_range() -> None:
    assert report.spread([1.2]) == "1.20"
    assert report.spread([1.0, 1.5, 1.3]) == "1.30 (1.00-1.50)"


def test_the_abuse_row_needs_a_full_run() -> None:
    assert not report.abuse_valid(None)
    assert not report.abuse_valid({"quick": True, "phases": {"alone": {}, "attack": {}}, "targets": {}})
    assert report.abuse_valid({"quick": False, "phases": {"alone": {}, "attack": {}}, "targets": {}})


def test_a_page_without_its_marks_is_refused() -> None:
    with pytest.raises(SystemExit, match="report:summary:start"):
        report.render("README.md", "# no table here\n")
