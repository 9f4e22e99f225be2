"""The settings table of the README, generated from the Settings class's field docstrings
(`genq settings` prints it; a test keeps the README in step)."""

from __future__ import annotations

import ast
import inspect

from shared.config import Settings


def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal right after it in the class body)."""
    body = ast.parse(inspect.getsource(Settings)).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
        ):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return ",".join(value) or '""'
    return str(value)


def markdown_table() -> str:
    docs = field_docs()
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        meaning = docs.get(name, "").replace("|", "/")
        rows.append(f"| `GENQ_{name.upper()}` | `{_default(field.default)}` | {meaning} |")
    return "\n".join(rows)
