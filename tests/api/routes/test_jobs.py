"""The v1 jobs contract, end to end: the real app, the suite's Redis, real worker processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import httpx
import pytest
import redis

from api.jobs.store import JobStore, NewJob, Submitted
from shared import keys
from shared.config import Settings
from shared.jobspec import JobSpec
from shared.schemas import JobList, JobPublic, JobSummary
from tests.api.conftest import ScriptedWorker
from tests.api.jobs.test_events import subscribed
from tests.conftest import WorkerProcess, api_client
from workers.jobs import ClaimOutcome, WorkerJobs

pytestmark = pytest.mark.anyio


async def _wait_status(
    api: httpx.AsyncClient, job_id: str, statuses: set[str], timeout_s: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = (await api.get(f"/v1/jobs/{job_id}")).json()
        if job["status"] in statuses or time.monotonic() > deadline:
            return job
        await asyncio.sleep(0.02)


async def test_submit_returns_202_with_location_and_the_queued_job(api: httpx.AsyncClient) -> None:
    response = await api.post("/v1/jobs", json={"prompt": "hello world", "metadata": {"team": "a"}})
    assert response.status_code == 202
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued"
    assert job["model"] == "placeholder-echo"
    # The input as accepted: every field of the spec, defaults filled in (max_tokens the server's).
    assert job["input"] == JobSpec(prompt="hello world", max_tokens=256).model_dump(mode="json")
    assert (job["input"]["template"], job["input"]["stop"], job["input"]["logit_bias"]) == ("chat", [], {})
    assert (job["input"]["webhook_events_filter"], job["input"]["priority"]) == (["completed"], "interactive")
    assert job["output"] is None and job["error"] is None
    assert job["metadata"] == {"team": "a"}
    assert job["created_at"].endswith("Z") and job["started_at"] is None
    assert job["urls"]["cancel"] == f"/v1/jobs/{job['id']}/cancel"
    assert (await api.get(job["urls"]["get"])).json() == job


async def test_a_worker_runs_the_job_to_success(api: httpx.AsyncClient, worker: WorkerProcess) -> None:
    job = (await api.post("/v1/jobs", json={"prompt": "one two three", "max_tokens": 4})).json()
    done = (await api.get(f"/v1/jobs/{job['id']}", params={"wait": 20})).json()
    assert done["status"] == "succeeded"
    assert done["output"] == {
        "text": "one two three one",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "cached_prompt_tokens": 0},
    }
    assert done["model_label"].startswith("placeholder")
    assert done["started_at"] >= done["created_at"] and done["completed_at"] >= done["started_at"]
    assert done["metrics"]["queue_ms"] >= 0 and done["metrics"]["inference_ms"] > 0
    assert done["metrics"]["batch_size"] >= 1


async def test_chat_messages_and_stop_strings(api: httpx.AsyncClient, worker: WorkerProcess) -> None:
    body = {
        "messages": [{"role": "user", "content": "alpha beta gamma"}],
        "stop": ["gamma"],
        "max_tokens": 10,
    }
    job = (await api.post("/v1/jobs", json=body, headers={"Prefer": "wait=20"})).json()
    assert job["status"] == "succeeded"
    assert job["output"]["finish_reason"] == "stop"
    assert "gamma" not in job["output"]["text"]


async def test_long_poll_returns_when_the_job_ends_not_at_the_timeout(
    api: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    job = (await api.post("/v1/jobs", json={"prompt": "quick", "max_tokens": 2})).json()
    started = time.monotonic()
    done = (await api.get(f"/v1/jobs/{job['id']}", params={"wait": 30})).json()
    assert done["status"] == "succeeded"
    assert time.monotonic() - started < 10


async def test_a_job_that_ends_while_the_long_poll_reads_it_is_answered_at_once(
    api: httpx.AsyncClient, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wake-up that arrives while the long-poll's read is in flight is not lost: the answer
    comes on it, not at the next recheck (2.5-5 s; api/jobs/queue.py RECHECK_S)."""
    job = (await api.post("/v1/jobs", json={"prompt": "ends mid-read"})).json()
    worker_jobs = WorkerJobs(
        redis_client, settings.lease_ttl_s, settings.max_attempts, settings.job_timeout_s
    )
    real_get = JobStore.get
    reads = 0

    async def read_then_end(store: JobStore, job_id: str, owner: str) -> dict[str, str] | None:
        nonlocal reads
        record = await real_get(store, job_id, owner)  # still queued
        reads += 1
        if reads == 1:  # a worker ends the job (its PUBLISH wakes the poller) before this read returns
            assert worker_jobs.claim(job_id, "w").outcome is ClaimOutcome.CLAIMED
            fields = {"status": "succeeded", "output": '{"text": "x"}', "metrics": '{"inference_ms": 1}'}
            assert worker_jobs.finish(job_id, "w", dict(fields))
            await asyncio.sleep(0.3)  # the events hub receives the job's PUBLISH meanwhile
        return record

    monkeypatch.setattr(JobStore, "get", read_then_end)
    started = time.monotonic()
    done = (await api.get(f"/v1/jobs/{job['id']}", params={"wait": 30})).json()
    assert done["status"] == "succeeded"
    assert reads == 2  # the stale read, then one more on the wake-up
    assert time.monotonic() - started < 2.0  # the recheck would come after 2.5 s at the soonest


async def test_long_poll_gives_up_after_wait_seconds_when_nothing_runs(api: httpx.AsyncClient) -> None:
    job = (await api.post("/v1/jobs", json={"prompt": "nobody runs me"})).json()
    started = time.monotonic()
    still = (await api.get(f"/v1/jobs/{job['id']}", params={"wait": 1})).json()
    assert still["status"] == "queued"
    assert 0.9 <= time.monotonic() - started < 5
    over = await api.get(f"/v1/jobs/{job['id']}", params={"wait": 61})
    assert over.status_code == 422 and over.json()["error"]["param"] == "wait"


async def test_prefer_wait_holds_the_submit_until_the_job_ends(
    api: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    response = await api.post(
        "/v1/jobs", json={"prompt": "x", "max_tokens": 3}, headers={"Prefer": "wait=20"}
    )
    assert response.status_code == 200
    assert response.json()["status"] == "succeeded"


async def test_prefer_wait_answers_202_when_time_runs_out(api: httpx.AsyncClient) -> None:
    response = await api.post("/v1/jobs", json={"prompt": "x"}, headers={"Prefer": "wait=1"})
    assert response.status_code == 202
    assert response.json()["status"] == "queued"


async def _end_once_queued(client: redis.Redis, scripted: ScriptedWorker, queue: str, after_s: float) -> str:
    """Acts as the worker: the first job found queued on `queue` runs for after_s, then succeeds."""
    while True:
        queued = cast(list[str], client.zrange(keys.queued(queue), 0, -1))
        if queued:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(after_s)
    scripted.claim(queued[0])
    scripted.succeed(queued[0], "x", 1)
    return queued[0]


async def _listening(client: redis.Redis) -> None:
    """Until the API's events subscription is up and has woken its waiters, as it does on each
    (re)subscription: a wake-up that would otherwise come during the test's wait."""
    await subscribed(client)
    await asyncio.sleep(0.2)


def _hgetall_calls(client: redis.Redis) -> int:
    stats = cast(dict[str, dict[str, int]], client.info("commandstats"))
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


async def test_prefer_wait_reads_the_job_it_queued_only_when_it_ends(
    api: httpx.AsyncClient, redis_client: redis.Redis, settings: Settings, scripted: ScriptedWorker
) -> None:
    """A job `Prefer: wait` has just queued is not read back (api/jobs/queue.py submit_and_wait):
    the API reads it once, on its end, where it took two reads (the first found it queued)."""
    await _listening(redis_client)
    queue = keys.queue_for_model(settings.model)
    worker = asyncio.create_task(_end_once_queued(redis_client, scripted, queue, after_s=0.2))
    redis_client.config_resetstat()
    response = await api.post("/v1/jobs", json={"prompt": "x", "cache": False}, headers={"Prefer": "wait=20"})
    job_id = await worker
    assert response.status_code == 200
    assert response.json()["id"] == job_id and response.json()["status"] == "succeeded"
    assert _hgetall_calls(redis_client) == 2  # claim.lua's, for its worker, and the API's one


async def test_a_chat_completion_reads_its_job_only_when_it_ends(
    api: httpx.AsyncClient, redis_client: redis.Redis, settings: Settings, scripted: ScriptedWorker
) -> None:
    """The OpenAI face waits as `Prefer: wait` does (api/openai/waiting.py): one read of the job."""
    await _listening(redis_client)
    queue = keys.queue_for_model(settings.model)
    worker = asyncio.create_task(_end_once_queued(redis_client, scripted, queue, after_s=0.2))
    redis_client.config_resetstat()
    body = {"messages": [{"role": "user", "content": "x"}]}
    response = await api.post("/v1/chat/completions", json=body)
    job_id = await worker
    assert response.status_code == 200 and response.headers["X-Genq-Job-Id"] == job_id
    assert response.json()["choices"][0]["message"]["content"] == "x"
    assert _hgetall_calls(redis_client) == 2  # claim.lua's, for its worker, and the API's one


async def test_prefer_wait_answers_at_once_for_a_job_that_ends_before_the_wait_starts(
    api: httpx.AsyncClient,
    redis_client: redis.Redis,
    scripted: ScriptedWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job's PUBLISH comes before the wait first awaits anything: the watch, set before the
    submit, has it, so the answer comes at once, not at the recheck (2.5-5 s; RECHECK_S)."""
    real_submit = JobStore.submit

    async def submit_then_end(store: JobStore, job: NewJob, *args: Any, **kwargs: Any) -> Submitted:
        submitted = await real_submit(store, job, *args, **kwargs)
        scripted.claim(job.job_id)
        scripted.succeed(job.job_id, "x", 1)
        await asyncio.sleep(0.3)  # the events hub receives the job's PUBLISH meanwhile
        return submitted

    await _listening(redis_client)
    monkeypatch.setattr(JobStore, "submit", submit_then_end)
    started = time.monotonic()
    response = await api.post("/v1/jobs", json={"prompt": "x", "cache": False}, headers={"Prefer": "wait=20"})
    assert response.status_code == 200 and response.json()["status"] == "succeeded"
    assert time.monotonic() - started < 2.0


async def test_idempotency_key_replays_the_same_job_and_refuses_a_different_body(
    api: httpx.AsyncClient, redis_client: redis.Redis
) -> None:
    headers = {"Idempotency-Key": "order-42"}
    first = await api.post("/v1/jobs", json={"prompt": "same"}, headers=headers)
    again = await api.post("/v1/jobs", json={"prompt": "same"}, headers=headers)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    other = await api.post("/v1/jobs", json={"prompt": "different"}, headers=headers)
    assert other.status_code == 409
    assert other.json()["error"]["type"] == "conflict"
    assert len(redis_client.keys("genq:job:*")) == 1
    assert redis_client.llen("genq.placeholder-echo") == 1


async def test_cancel_a_queued_job_means_it_never_starts(
    api: httpx.AsyncClient, settings: Settings, start_worker: Callable[..., WorkerProcess]
) -> None:
    job = (await api.post("/v1/jobs", json={"prompt": "never"})).json()
    canceled = await api.post(f"/v1/jobs/{job['id']}/cancel")
    assert canceled.status_code == 200
    assert canceled.json()["status"] == "canceled"
    start_worker(settings)
    marker = (await api.post("/v1/jobs", json={"prompt": "after", "max_tokens": 1},
                             headers={"Prefer": "wait=20"})).json()  # fmt: skip
    assert marker["status"] == "succeeded"  # the worker has passed the canceled job's message
    after = (await api.get(f"/v1/jobs/{job['id']}")).json()
    assert after["status"] == "canceled" and after["started_at"] is None and after["output"] is None


async def test_cancel_a_running_job_stops_it_and_frees_its_slot(
    make_settings: Callable[..., Settings],
    redis_client: redis.Redis,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    from tests.conftest import api_client

    settings = make_settings(placeholder_step_s=0.05)
    start_worker(settings, "--concurrency=1")
    async with api_client(settings) as api:
        job = (await api.post("/v1/jobs", json={"prompt": "long", "max_tokens": 400})).json()
        assert (await _wait_status(api, job["id"], {"running"}))["status"] == "running"
        canceled = (await api.post(f"/v1/jobs/{job['id']}/cancel")).json()
        assert canceled["status"] == "canceled"
        # One worker slot: the next job can only run once the canceled one has left the engine.
        nxt = await api.post(
            "/v1/jobs", json={"prompt": "next", "max_tokens": 2}, headers={"Prefer": "wait=10"}
        )
        assert nxt.json()["status"] == "succeeded"
        final = (await api.get(f"/v1/jobs/{job['id']}")).json()
        assert final["status"] == "canceled" and final["output"] is None


async def test_cancel_a_finished_job_returns_it_unchanged(
    api: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    job = (
        await api.post("/v1/jobs", json={"prompt": "x", "max_tokens": 1}, headers={"Prefer": "wait=20"})
    ).json()
    response = await api.post(f"/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 200
    assert response.json() == job


async def test_every_job_answer_is_what_the_openapi_document_says(
    api: httpx.AsyncClient, worker: WorkerProcess
) -> None:
    """The routes send the store's JobView as is; JobPublic and JobList (their response models in
    /openapi.json) describe it: every field and no other, whatever state the job is in (failed:
    the placeholder engine refuses logprobs)."""
    body = {"prompt": "documented", "max_tokens": 2}
    done = await api.post("/v1/jobs", json=body, headers={"Prefer": "wait=20"})
    failed = await api.post("/v1/jobs", json=body | {"logprobs": 1}, headers={"Prefer": "wait=20"})
    queued = await api.post("/v1/jobs", json={"prompt": "x", "max_tokens": 1, "priority": "batch"})
    canceled = await api.post(f"/v1/jobs/{queued.json()['id']}/cancel")
    cached = await api.post("/v1/jobs", json=body)
    assert [done.json()["status"], failed.json()["status"], cached.json()["cached"]] == [
        "succeeded",
        "failed",
        True,
    ]
    for response in (done, failed, queued, canceled, cached, await api.get(done.headers["location"])):
        job = response.json()
        assert set(job) == set(JobPublic.model_fields)
        JobPublic.model_validate(job)
    listed = (await api.get("/v1/jobs")).json()
    summaries = JobList.model_validate(listed).data
    assert {job.id for job in summaries} >= {done.json()["id"], failed.json()["id"], queued.json()["id"]}
    assert all(set(job) == set(JobSummary.model_fields) for job in listed["data"])


async def test_unknown_job_is_404_everywhere(api: httpx.AsyncClient) -> None:
    for response in (await api.get("/v1/jobs/nope"), await api.post("/v1/jobs/nope/cancel")):
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found"


async def test_list_is_newest_first_paginated_and_filtered(api: httpx.AsyncClient) -> None:
    ids = [(await api.post("/v1/jobs", json={"prompt": f"p{i}"})).json()["id"] for i in range(7)]
    await api.post(f"/v1/jobs/{ids[2]}/cancel")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = (await api.get("/v1/jobs", params=params)).json()
        seen += [job["id"] for job in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    canceled = (await api.get("/v1/jobs", params={"status": "canceled"})).json()
    assert [job["id"] for job in canceled["data"]] == [ids[2]]
    bad = await api.get("/v1/jobs", params={"status": "sleeping"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "status"


async def test_lists_carry_summaries_within_a_byte_bound(
    make_settings: Callable[..., Settings], redis_client: redis.Redis
) -> None:
    settings = make_settings(list_max_bytes=8192)
    async with api_client(settings) as api:
        big = "x" * 100_000
        ids = [(await api.post("/v1/jobs", json={"prompt": f"{i} {big}"})).json()["id"] for i in range(6)]
        metadata = {f"k{j}": "v" * 500 for j in range(4)}  # ~2 KB a summary: several pages
        ids += [(await api.post("/v1/jobs", json={"prompt": "small", "metadata": metadata})).json()["id"]
                for _ in range(12)]  # fmt: skip
        seen: list[str] = []
        cursor = None
        while True:
            params = {"limit": 100} | ({"cursor": cursor} if cursor else {})
            response = await api.get("/v1/jobs", params=params)
            assert len(response.content) <= settings.list_max_bytes + 200  # the envelope
            page = response.json()
            for job in page["data"]:
                assert "input" not in job and "output" not in job
                assert len(job["preview"]) <= 120
            seen += [job["id"] for job in page["data"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == ids[::-1]  # every job, once, newest first, over several pages
        assert (await api.get(f"/v1/jobs/{ids[0]}")).json()["input"]["prompt"] == f"0 {big}"


async def test_priorities_an_interactive_job_overtakes_1000_batch_jobs(
    api: httpx.AsyncClient,
    settings: Settings,
    start_worker: Callable[..., WorkerProcess],
    redis_client: redis.Redis,
) -> None:
    batch = [
        (await api.post("/v1/jobs", json={"prompt": f"b{i}", "max_tokens": 1, "priority": "batch"})).json()[
            "id"
        ]
        for i in range(1000)
    ]
    start_worker(settings, "--concurrency=2")
    await _wait_status(api, batch[20], {"succeeded"})  # the worker is busy with batch jobs
    submitted_at = time.time()
    urgent = (await api.post("/v1/jobs", json={"prompt": "urgent", "max_tokens": 1})).json()
    urgent = await _wait_status(api, urgent["id"], {"succeeded"})
    pipe = redis_client.pipeline()
    for job_id in batch:
        pipe.hget(f"genq:job:{job_id}", "started_at")
    started = [float(s) for s in pipe.execute() if s]
    urgent_started = float(cast(str, redis_client.hget(f"genq:job:{urgent['id']}", "started_at")))
    started_ahead = [s for s in started if submitted_at < s < urgent_started]
    overtaken = len(batch) - sum(s < urgent_started for s in started)
    assert overtaken > 500  # it really went ahead of most of them
    # Only messages already reserved by the two worker slots may start before it.
    assert len(started_ahead) <= 2, started_ahead
