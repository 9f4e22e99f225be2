"""api/edge/responses.py: JSON answers encoded once, compactly, as the bytes clients parse; a job
exactly as the job store's view holds it."""

from __future__ import annotations

from typing import cast

import httpx
import orjson
import pytest
import redis

from api.edge.responses import job_response, json_response
from shared import keys
from shared.jobqueue.records import public_job

pytestmark = pytest.mark.anyio


def test_a_json_answer_is_compact_utf8_with_its_status_and_headers() -> None:
    response = json_response({"text": "héllo ✓", "n": [1, None]}, 201, {"Location": "/v1/jobs/x"})
    assert response.body == '{"text":"héllo ✓","n":[1,null]}'.encode()
    assert response.status_code == 201
    assert response.headers["content-type"] == "application/json"
    assert response.headers["location"] == "/v1/jobs/x"
    assert response.headers["content-length"] == str(len(response.body))


async def test_a_job_reads_as_its_store_view_whichever_way_it_is_asked(
    api: httpx.AsyncClient, redis_client: redis.Redis
) -> None:
    job_id = (await api.post("/v1/jobs", json={"prompt": "as stored"})).json()["id"]
    view = public_job(cast(dict[str, str], redis_client.hgetall(keys.job(job_id))))
    sent = job_response(view)
    assert orjson.loads(sent.body)["status"] == "queued"  # the status enum as its value
    # The hot path answers the first; another query string goes on to the FastAPI route.
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}?via=fastapi"):
        assert (await api.get(path)).content == sent.body
