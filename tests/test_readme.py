"""The README keeps its promises: the two commands first, short lines, and every setting documented
(in docs/settings.md, generated from the settings' docstrings)."""

from __future__ import annotations

from pathlib import Path

from cli.settings_doc import markdown_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_first_lines_give_make_run_and_make_test() -> None:
    head = "\n".join(README.splitlines()[:8])
    assert "make run" in head and "make test" in head


def test_the_readme_is_short_and_its_lines_fit_a_screen() -> None:
    lines = README.splitlines()
    assert len(lines) <= 250
    assert [n for n, line in enumerate(lines, 1) if len(line) > 160] == []


def test_the_settings_table_is_current() -> None:
    page = (ROOT / "docs" / "settings.md").read_text()
    assert markdown_table() in page, "run `genq settings --doc docs/settings.md`"


def test_ci_runs_exactly_make_test() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == ["make test"]
