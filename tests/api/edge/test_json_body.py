"""api/edge/json_body.py: where in a parsed JSON body a lone surrogate is. The routes' answers
(422 / OpenAI's 400 naming the field, nothing written) are tests/api/test_bad_text.py's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.edge.json_body import lone_surrogate_at


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"prompt": "plain", "n": 2, "stop": ["é", "😀"]}, None),
        ({"prompt": "a\ud800"}, ("prompt",)),
        ({"messages": [{"content": "ok"}, {"content": "\udfff"}]}, ("messages", 1, "content")),
        ({"metadata": {"\ud800key": "v"}}, ("metadata",)),  # a key is named by its object
        (["\ud83d"], (0,)),
        ("\ud800", ()),
        (json.loads('"\\ud83d\\ude00"'), None),  # an escaped pair parses to one character
    ],
)
def test_the_path_of_the_first_lone_surrogate(body: Any, path: tuple[int | str, ...] | None) -> None:
    assert lone_surrogate_at(body) == path
