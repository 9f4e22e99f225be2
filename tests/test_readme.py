"""The README keeps its promises: the two commands first, and every setting documented."""

from __future__ import annotations

from pathlib import Path

from cli.settings_doc import markdown_table

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_the_first_lines_give_make_run_and_make_test() -> None:
    head = "\n".join(README.splitlines()[:8])
    assert "make run" in head and "make test" in head


def test_the_settings_table_is_current() -> None:
    assert markdown_table() in README, "run `genq settings --readme README.md`"


def test_ci_runs_exactly_make_test() -> None:
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == ["make test"]
