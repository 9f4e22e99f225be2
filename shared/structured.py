"""Structured outputs: the grammar of a response format, shared by the API (which refuses a schema
that cannot compile, 400 at submit) and the engine (which enforces it with token masks).

The grammar engine is llguidance (also one of vLLM's and SGLang's backends): a small Rust wheel with
no dependencies, so the API tier can compile schemas without torch. xgrammar, the other candidate,
pulls triton into a CPU install. JSON is generated compact (no free whitespace between tokens): a
model, and above all random-tiny, can otherwise fill its whole budget with spaces and newlines.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from llguidance import LLMatcher

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

#: What `{"type": "json_object"}` means: any JSON object.
ANY_OBJECT = '{"type": "object"}'
#: Compact JSON: "," and ":" separators, no whitespace the model may add.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


def grammar(schema: str) -> str:
    """The llguidance grammar of a JSON schema (serialized)."""
    return str(LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS))


def schema_error(schema: dict[str, Any]) -> str | None:
    """Why this JSON schema cannot be enforced (None: it can)."""
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as exc:
        return str(exc)
    error = LLMatcher.validate_grammar(grammar(text))
    return str(error) if error else None


def schema_of(response_format: dict[str, Any] | None) -> str | None:
    """The JSON schema (serialized) a job's response_format asks for; None for free text."""
    kind = (response_format or {}).get("type", "text")
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        return json.dumps((response_format or {})["json_schema"]["schema"])
    return None
