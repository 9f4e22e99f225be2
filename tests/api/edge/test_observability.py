"""api/edge/observability.py: every answer carries a request id (the client's when sensible) and
the rate-limit state the request's dependencies left; requests are counted under their route
template, and one that matched no route under `unmatched`, never its raw path. (Route templates
and /metrics's content are tests/api/test_metrics.py's; its token, tests/api/test_exposure.py's.)"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import REGISTRY

from api.edge.observability import extra_headers, request_id_of

pytestmark = pytest.mark.anyio


def test_a_sensible_request_id_is_kept_and_any_other_replaced() -> None:
    assert request_id_of(b"req-42") == "req-42"
    assert request_id_of(b"r" * 128) == "r" * 128
    for sent in (None, b"", b"r" * 129):
        made = request_id_of(sent)
        assert len(made) == 32 and int(made, 16) >= 0
    assert request_id_of(None) != request_id_of(None)


def test_the_headers_left_for_a_response_follow_its_request_id() -> None:
    assert extra_headers("abc", {"X-RateLimit-Remaining": "3"}) == [
        (b"x-request-id", b"abc"),
        (b"x-ratelimit-remaining", b"3"),
    ]


def test_a_header_the_response_set_itself_is_not_added_again() -> None:
    more = {"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "3"}
    assert extra_headers("abc", more, {b"x-ratelimit-limit", b"x-ratelimit-remaining"}) == [
        (b"x-request-id", b"abc")
    ]


@pytest.mark.parametrize("path", ["/v1/jobs", "/healthz"])
async def test_every_answer_carries_its_request_id(api: httpx.AsyncClient, path: str) -> None:
    kept = await api.get(path, headers={"X-Request-ID": "trace-7"})
    assert kept.headers.get_list("x-request-id") == ["trace-7"]
    replaced = await api.get(path, headers={"X-Request-ID": "x" * 200})
    assert len(replaced.headers["x-request-id"]) == 32


async def test_a_routes_rate_limit_state_reaches_its_answer(api: httpx.AsyncClient) -> None:
    listed = await api.get("/v1/jobs")  # a FastAPI route whose dependency takes a read token
    assert listed.status_code == 200
    assert listed.headers["x-ratelimit-limit"] == "100000"
    assert int(listed.headers["x-ratelimit-remaining"]) < 100000


async def test_a_path_no_route_matched_is_counted_as_unmatched(api: httpx.AsyncClient) -> None:
    def counted(route: str) -> float:
        labels = {"route": route, "method": "GET", "status": "404"}
        return REGISTRY.get_sample_value("genq_http_requests_total", labels) or 0.0

    before = counted("unmatched")
    await api.get("/no/such/path-a1")
    await api.get("/no/such/path-b2")
    assert counted("unmatched") == before + 2
    assert counted("/no/such/path-a1") == 0
