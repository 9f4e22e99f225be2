"""shared/structured.py: what a response_format asks for, and whether its schema can be enforced
(the API refuses one that cannot, at submit)."""

from __future__ import annotations

import json

from shared.structured import ANY_OBJECT, ResponseFormat, grammar, schema_error, schema_of

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_schema_of_each_response_format() -> None:
    assert schema_of(None) is None
    assert schema_of(ResponseFormat(type="text")) is None
    assert schema_of(ResponseFormat(type="json_object")) == ANY_OBJECT
    asked = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    assert json.loads(schema_of(ResponseFormat.model_validate(asked)) or "") == PERSON


def test_an_enforceable_schema_has_no_error_and_a_grammar() -> None:
    assert schema_error(PERSON) is None
    assert schema_error(json.loads(ANY_OBJECT)) is None
    assert grammar(json.dumps(PERSON))


def test_a_schema_that_cannot_compile_says_why() -> None:
    error = schema_error({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})
    assert error is not None and "missing" in error
    assert schema_error({"type": "no-such-type"}) is not None


def test_a_schema_that_is_not_json_says_why() -> None:
    error = schema_error({"x": object()})
    assert error is not None and "not JSON serializable" in error
