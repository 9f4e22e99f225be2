"""cli/settings_doc.py: the README's settings table comes from the Settings class. Every setting
has a row with its default and its docstring (a field without one would be a setting nobody can
look up), and rewriting a README replaces the table alone, the same way each time. (That the
README's table is current: tests/test_readme.py.)"""

from __future__ import annotations

from cli.settings_doc import END_MARK, START_MARK, field_docs, markdown_table, update_doc
from shared.config import Settings


def test_every_setting_has_a_docstring() -> None:
    docs = field_docs()
    assert set(Settings.model_fields) <= set(docs), set(Settings.model_fields) - set(docs)
    assert all(doc and "  " not in doc and "\n" not in doc for doc in docs.values())


def test_one_row_per_setting_with_its_default() -> None:
    rows = markdown_table().splitlines()
    assert rows[:2] == ["| Variable | Default | Meaning |", "|---|---|---|"]
    assert len(rows) == 2 + len(Settings.model_fields)
    by_name = {row.split("`")[1]: row for row in rows[2:]}
    assert by_name["GENQ_MODEL"].split(" | ")[1] == f"`{Settings.model_fields['model'].default}`"
    assert by_name["GENQ_REDIS_URL"].split(" | ")[1] == "`unset`"
    assert "`5,300,1800,7200,18000,36000`" in by_name["GENQ_WEBHOOK_RETRY_DELAYS_S"]
    # A "|" in a docstring would split its row into more columns.
    assert all(row.count(" | ") == 2 for row in rows[2:])


def test_update_doc_replaces_only_the_table_and_is_stable() -> None:
    readme = f"# genq\n\nintro\n{START_MARK}\n| stale | table |\n{END_MARK}\n\n## After\ntext\n"
    updated = update_doc(readme)
    assert updated.startswith("# genq\n\nintro\n" + START_MARK + "\n| Variable |")
    assert updated.endswith(END_MARK + "\n\n## After\ntext\n") and "stale" not in updated
    assert update_doc(updated) == updated
