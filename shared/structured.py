"""Structured outputs: the response format a job asks for (OpenAI's `response_format`) and its
grammar, shared by the API (which refuses a schema that cannot compile, 422 at submit, once the
caller is known: api/jobs/schema_compile.py) and the engine (which enforces it with token masks).

The grammar engine is llguidance (also one of vLLM's and SGLang's backends): a small Rust wheel with
no dependencies, so the API tier can compile schemas without torch. xgrammar, the other candidate,
pulls triton into a CPU install. JSON is generated compact (no free whitespace between tokens): a
model, and above all random-tiny, can otherwise fill its whole budget with spaces and newlines.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

from llguidance import LLMatcher
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

#: What `{"type": "json_object"}` means: any JSON object.
ANY_OBJECT = '{"type": "object"}'
#: Compact JSON: "," and ":" separators, no whitespace the model may add.
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
#: Longest `response_format.json_schema.schema`, serialized: checked as the body is parsed (cheap);
#: whether it compiles is asked once the caller is known.
JSON_SCHEMA_MAX_BYTES = 64 << 10


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True, populate_by_name=True)

    name: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    description: Annotated[str, StringConstraints(max_length=2048)] | None = None
    #: The JSON schema every completion must match ("schema" on the wire).
    json_schema: dict[str, Any] = Field(alias="schema")
    #: Accepted for OpenAI's clients; the schema is enforced either way (as vLLM does).
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: free text, any JSON object, or JSON matching a schema, enforced
    token by token. Parsing checks its shape and the schema's size only: compiling the schema costs
    CPU and memory, so it is asked after the caller is authenticated."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("give `json_schema` exactly when type is 'json_schema'")
        if self.json_schema is not None:
            try:
                size = len(json.dumps(self.json_schema.json_schema))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"the JSON schema is not JSON: {exc}") from exc
            if size > JSON_SCHEMA_MAX_BYTES:
                raise ValueError(f"the JSON schema is over {JSON_SCHEMA_MAX_BYTES} bytes as JSON")
        return self


def grammar(schema: str) -> str:
    """The llguidance grammar of a JSON schema (serialized)."""
    return str(LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS))


def schema_error(schema: dict[str, Any]) -> str | None:
    """Why this JSON schema cannot be enforced (None: it can). It compiles the schema here, on the
    caller's thread: the API asks api/jobs/schema_compile.py instead, which compiles in a process."""
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return grammar_error(text)


def grammar_error(schema: str) -> str | None:
    """Why this JSON schema (serialized) cannot be enforced (None: it can), within llguidance's own
    bounds on a grammar's size and its lexer (the defaults the engine's matchers run under)."""
    error = LLMatcher.validate_grammar(grammar(schema))
    return str(error) if error else None


def schema_of(response_format: ResponseFormat | None) -> str | None:
    """The JSON schema (serialized) a job's response_format asks for; None for free text."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.json_schema is None:  # json_object
        return ANY_OBJECT
    return json.dumps(response_format.json_schema.json_schema)
