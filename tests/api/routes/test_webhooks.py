"""api/routes/webhooks.py: a job's webhook delivery log, shown to the job's owner only, oldest
attempt first; and /v1/webhook-secret, which makes or rotates the caller's signing secret and shows
it in that answer only. Attempts are recorded by the delivery worker's own calls
(workers/webhooks/delivery.py), with no receiver. (Deliveries end to end:
tests/workers/webhooks/test_tasks.py.)"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable

import httpx
import pytest
import redis

from shared.config import Settings
from shared.key_secrets import SECRET_BYTES
from tests.conftest import api_client
from workers.webhooks.client import AttemptResult
from workers.webhooks.delivery import Deliveries, Delivery, log_entry
from workers.webhooks.outcomes import Outcome, Verdict

pytestmark = pytest.mark.anyio

KEYS = ["key-a", "key-b"]


@pytest.fixture
def settings(make_settings: Callable[..., Settings], redis_client: redis.Redis) -> Settings:
    # No webhook worker runs: the deliveries a job's submission publishes stay queued.
    return make_settings(api_keys=KEYS, webhook_allow_private=True)


async def submitted(api: httpx.AsyncClient, webhook: str | None = "http://127.0.0.1:9/hook") -> str:
    body = {"prompt": "x", "cache": False} | ({"webhook": webhook} if webhook else {})
    response = await api.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def record_attempt(
    client: redis.Redis, settings: Settings, job_id: str, event: str, status_code: int
) -> None:
    """One delivery attempt, logged the way the webhook worker logs it."""
    delivery = Delivery.of(job_id, event, "")
    verdict = Verdict(Outcome.DELIVERED, None) if status_code < 300 else Verdict(Outcome.RETRYING, 5.0)
    entry = log_entry(delivery, 1, AttemptResult(status_code, None, False, 12.5), verdict)
    deliveries = Deliveries(client, settings)
    deliveries.record_attempt(deliveries.attempt_record(delivery, 0, {"outcome": verdict.outcome}, entry))


async def test_the_owner_sees_each_attempt_oldest_first(
    settings: Settings, redis_client: redis.Redis
) -> None:
    async with api_client(settings, "key-a") as owner:
        job_id = await submitted(owner)
        record_attempt(redis_client, settings, job_id, "start", 503)
        record_attempt(redis_client, settings, job_id, "completed", 200)
        response = await owner.get(f"/v1/jobs/{job_id}/webhooks")
    assert response.status_code == 200
    log = response.json()["data"]
    assert [(e["event"], e["status_code"], e["outcome"]) for e in log] == [
        ("start", 503, "retrying"),
        ("completed", 200, "delivered"),
    ]
    assert "next_attempt_at" in log[0] and "next_attempt_at" not in log[1]


async def test_a_job_without_a_webhook_or_attempts_has_an_empty_log(settings: Settings) -> None:
    async with api_client(settings, "key-a") as owner:
        for job_id in (await submitted(owner, webhook=None), await submitted(owner)):
            response = await owner.get(f"/v1/jobs/{job_id}/webhooks")
            assert (response.status_code, response.json()) == (200, {"data": []})


async def test_another_keys_job_is_not_found(settings: Settings, redis_client: redis.Redis) -> None:
    """Another tenant learns nothing, not even that the job exists: the same 404 as no job."""
    async with (
        api_client(settings, "key-a") as owner,
        api_client(settings, "key-b") as other,
        api_client(settings) as anonymous,
    ):
        job_id = await submitted(owner)
        record_attempt(redis_client, settings, job_id, "start", 200)
        for client, path in ((other, job_id), (owner, "no-such-job")):
            response = await client.get(f"/v1/jobs/{path}/webhooks")
            assert response.status_code == 404
            assert response.json()["error"]["type"] == "not_found"
        assert (await anonymous.get(f"/v1/jobs/{job_id}/webhooks")).status_code == 401


async def test_a_secret_is_made_then_rotated_and_never_logged(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with api_client(settings, "key-a") as a, api_client(settings, "key-b") as b:
        made = await a.post("/v1/webhook-secret")
        rotated = await a.post("/v1/webhook-secret")
        other = await b.post("/v1/webhook-secret")
    assert (made.status_code, rotated.status_code, other.status_code) == (201, 201, 201)
    assert made.json()["previous_valid_for_s"] is None  # nothing replaced
    assert rotated.json()["previous_valid_for_s"] == 86_400  # the old one signs for a day more
    assert other.json()["previous_valid_for_s"] is None  # each key has its own
    secrets = [answer.json()["secret"] for answer in (made, rotated, other)]
    assert len(set(secrets)) == 3
    assert caplog.records  # the app logs at DEBUG: the check below looks at real records
    for secret in secrets:
        assert secret.startswith("whsec_")
        assert len(base64.b64decode(secret.removeprefix("whsec_"))) == SECRET_BYTES  # Standard Webhooks'
        logged = [record for record in caplog.records if secret in str(vars(record))]
        assert logged == [], "a signing secret reached the logs"
