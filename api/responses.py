"""JSON responses serialised once with orjson (the hot paths skip FastAPI's re-validation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import Response


def json_response(content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code, headers, media_type="application/json")
