"""The job store's Lua scripts as state machines: each case sets a job's state in a real Redis,
runs one script, and checks the state after (record, indexes, queue list, kombu's unacked hash).
Jobs are accepted through the real submit script, so every case starts from what the API writes.
Each script call may touch only the keys it declares (tests/shared/jobqueue/script_keys.py)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import orjson
import pytest
import redis
import redis.client

from api.jobs.store import NewJob, cancel_labels, submit_labels
from cli.redis_server import EmbeddedRedis
from shared import keys
from shared.celery_app import queue_lists
from shared.jobqueue import scripts
from shared.jobqueue.reaper import Reaper
from shared.jobqueue.records import TIMEOUT_ERROR, WORKER_LOST_ERROR, job_message, public_job
from tests.conftest import commands_while
from tests.shared.jobqueue.script_keys import checked_client
from workers.jobs import ClaimOutcome, NextTake, WorkerJobs

QUEUE = keys.queue_for_model("placeholder-echo")
LIST = keys.queue_key(QUEUE, 0)
OWNER = "key-a"
LEASE_S = 30.0
MAX_ATTEMPTS = 3
TIMEOUT_S = 600.0

Script = Callable[..., Any]


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    """Every script call runs allowed only the keys it declares (tests/shared/jobqueue/script_keys.py)."""
    yield from checked_client(redis_server.url)


@pytest.fixture
def jobs(client: redis.Redis) -> WorkerJobs:
    return WorkerJobs(client, LEASE_S, MAX_ATTEMPTS, TIMEOUT_S)


def script(client: redis.Redis, name: str) -> scripts.Script:
    return scripts.Script(client, name)


def submit(
    client: redis.Redis,
    job_id: str,
    *,
    deadline_in: float = TIMEOUT_S,
    cache_key: str = "",
    bounds: tuple[int, int] = (0, 0),
    owner: str = OWNER,
    input_json: bytes = b'{"prompt":"hi"}',
    webhook_messages: tuple[tuple[str, bytes], ...] = (),
) -> list[Any]:
    """Accept a job through the submit script, as JobStore.submit does."""
    now = time.time()
    job = NewJob(job_id=job_id, owner=owner, model="placeholder-echo", queue=QUEUE,
                 input_json=input_json, metadata_json=b"{}", created_at=now, deadline=now + deadline_in,
                 cache_key=cache_key, webhook_messages=webhook_messages)  # fmt: skip
    message, queue_list = job_message(job_id, QUEUE, 0)
    inflight = keys.inflight(cache_key) if cache_key else ""
    today = int(now // 86_400)
    return list(script(client, "submit")(
        keys=[keys.job(job_id), keys.owner_jobs(owner), queue_list, "", inflight, "", keys.owner_live(owner)],
        args=[job_id, int(now * 1e6), 86_400, message, 60, "", "(0", repr(now), "", "",
              bounds[0], bounds[1], job.stored_bytes, today, 1, *job.fields()],
        labels=submit_labels(job, today, 1, bounds[1] > 0),
    ))  # fmt: skip


def record(client: redis.Redis, job_id: str) -> dict[str, str]:
    return cast(dict[str, str], client.hgetall(keys.job(job_id)))


def indexed(client: redis.Redis, job_id: str) -> set[str]:
    """The queue's and the reaper's indexes, and the owner's live set, that hold the job."""
    found = {name for name, key in [("leases", keys.LEASES), ("deadlines", keys.DEADLINES),
                                    ("orphan_checks", keys.ORPHAN_CHECKS), ("queued", keys.queued(QUEUE))]
             if client.zscore(key, job_id) is not None}  # fmt: skip
    return found | ({"live"} if client.hexists(keys.owner_live(OWNER), job_id) else set())


def messages_in_list(client: redis.Redis, job_id: str) -> int:
    return sum(orjson.loads(m)["headers"]["id"] == job_id for m in client.lrange(LIST, 0, -1))


def deliver(client: redis.Redis, job_id: str) -> str:
    """What a Celery worker does when it takes the job's message: list -> kombu's unacked hash."""
    raw = cast(str | None, client.rpop(LIST))  # one element: no count given
    assert raw is not None and orjson.loads(raw)["headers"]["id"] == job_id
    tag = orjson.loads(raw)["properties"]["delivery_tag"]
    client.hset(keys.KOMBU_UNACKED, tag, orjson.dumps([orjson.loads(raw), "", QUEUE]))
    client.zadd(keys.KOMBU_UNACKED_INDEX, {tag: time.time()})
    return str(tag)


def lapse(client: redis.Redis, job_id: str) -> None:
    """The job's worker stopped renewing its lease (died, hung, or dropped the job)."""
    client.hset(keys.job(job_id), "lease", "1")
    client.zadd(keys.LEASES, {job_id: 1})


# --- submit ----------------------------------------------------------------------------------------


def test_submit_queues_the_job_and_indexes_it(client: redis.Redis) -> None:
    assert submit(client, "j1") == [1]
    rec = record(client, "j1")
    assert rec["status"] == "queued" and rec["queue_key"] == LIST and rec["message"]
    assert messages_in_list(client, "j1") == 1
    assert indexed(client, "j1") == {"queued", "deadlines", "orphan_checks", "live"}


@pytest.mark.parametrize(
    ("bounds", "bound"), [((2, 0), "live_jobs"), ((0, 2 * len(b'{"prompt":"hi"}{}') + 1), "stored_bytes")]
)
def test_submit_past_an_owner_bound_writes_nothing(
    client: redis.Redis, bounds: tuple[int, int], bound: str
) -> None:
    assert submit(client, "j1", bounds=bounds) == [1]
    assert submit(client, "j2", bounds=bounds) == [1]
    assert submit(client, "j3", bounds=bounds) == [4, bound, max(bounds)]
    assert record(client, "j3") == {} and client.llen(LIST) == 2
    # Another key is not held to this key's bound.
    assert submit(client, "j4", bounds=bounds, owner="key-b") == [1]


def test_a_finished_job_no_longer_counts_as_live(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1", bounds=(1, 0))
    assert submit(client, "j2", bounds=(1, 0))[0] == 4
    deliver(client, "j1")
    jobs.claim("j1", "w1")
    assert jobs.finish("j1", "w1", {"status": "succeeded", "output": "{}"})
    assert submit(client, "j2", bounds=(1, 0)) == [1]


# --- claim -----------------------------------------------------------------------------------------


def test_claim_of_a_queued_job(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    tag = deliver(client, "j1")
    claim = jobs.claim("j1", "w1")
    assert claim.outcome is ClaimOutcome.CLAIMED
    rec = record(client, "j1")
    assert claim.record == rec  # the worker runs the job from it, without reading it again
    assert (rec["status"], rec["worker"], rec["attempts"], rec["delivery_tag"]) == ("running", "w1", "1", tag)
    assert float(rec["lease"]) > time.time() + LEASE_S - 5 and "message" not in rec
    assert indexed(client, "j1") == {"leases", "live"}


@pytest.mark.parametrize(
    ("tag", "spaced"),
    [("0f3e-a1", False), ("0f3e-a1", True), ('a "quoted", tag', True)],
    ids=["genq", "kombu", "not-a-word"],
)
def test_claim_records_the_messages_delivery_tag(
    client: redis.Redis, jobs: WorkerJobs, tag: str, spaced: bool
) -> None:
    """A claim finds the tag by a pattern in genq's compact JSON and in kombu's (json.dumps'
    spacing), and decodes the whole message for a tag that is not a plain word."""
    submit(client, "j1")
    envelope = orjson.loads(cast(str, client.hget(keys.job("j1"), "message")))
    envelope["properties"]["delivery_tag"] = tag
    client.hset(keys.job("j1"), "message", json.dumps(envelope) if spaced else orjson.dumps(envelope))
    assert jobs.claim("j1", "w1").outcome is ClaimOutcome.CLAIMED
    assert record(client, "j1")["delivery_tag"] == tag


def test_claim_past_the_deadline_fails_the_job(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1", deadline_in=-1)
    deliver(client, "j1")
    assert jobs.claim("j1", "w1").outcome is ClaimOutcome.EXPIRED
    rec = record(client, "j1")
    assert rec["status"] == "failed" and orjson.loads(rec["error"])["type"] == "timeout"
    assert indexed(client, "j1") == set()


def test_claim_of_a_job_whose_lease_holds_is_skipped(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    deliver(client, "j1")
    jobs.claim("j1", "w1")
    assert jobs.claim("j1", "w2").outcome is ClaimOutcome.SKIP
    assert record(client, "j1")["worker"] == "w1"


def test_a_lapsed_lease_is_taken_over_even_while_its_worker_heart_beats(
    client: redis.Redis, jobs: WorkerJobs
) -> None:
    """The worker is alive but dropped the job (acked on an error, a lost finish write): the
    lease, not the heartbeat, says whether the job is held."""
    submit(client, "j1")
    tag = deliver(client, "j1")
    jobs.claim("j1", "w1")
    jobs.heartbeat("w1")
    lapse(client, "j1")
    assert jobs.claim("j1", "w2").outcome is ClaimOutcome.CLAIMED
    rec = record(client, "j1")
    assert (rec["worker"], rec["attempts"]) == ("w2", "2")
    assert not client.hexists(keys.KOMBU_UNACKED, tag)  # the first worker's copy is gone


def test_a_lapsed_lease_past_max_attempts_fails_the_job(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    deliver(client, "j1")
    jobs.claim("j1", "w1")
    client.hset(keys.job("j1"), "attempts", MAX_ATTEMPTS)
    lapse(client, "j1")
    assert jobs.claim("j1", "w2").outcome is ClaimOutcome.EXHAUSTED
    rec = record(client, "j1")
    assert rec["status"] == "failed" and rec["error"] == WORKER_LOST_ERROR.decode()
    assert indexed(client, "j1") == set()


@pytest.mark.parametrize("status", ["succeeded", "failed", "canceled"])
def test_claim_of_an_ended_job_is_skipped(client: redis.Redis, jobs: WorkerJobs, status: str) -> None:
    submit(client, "j1")
    client.hset(keys.job("j1"), "status", status)
    assert jobs.claim("j1", "w1").outcome is ClaimOutcome.SKIP
    assert record(client, "j1")["status"] == status


def test_claim_of_a_missing_job(jobs: WorkerJobs) -> None:
    assert jobs.claim("nope", "w1").outcome is ClaimOutcome.MISSING


# --- renew, finish, hand back ----------------------------------------------------------------------


def test_renew_extends_held_leases_and_names_the_lost(client: redis.Redis, jobs: WorkerJobs) -> None:
    for job_id in ("j1", "j2"):
        submit(client, job_id)
        deliver(client, job_id)
        jobs.claim(job_id, "w1")
        lapse(client, job_id)
    client.hset(keys.job("j2"), "status", "canceled")
    assert jobs.renew("w1", ["j1", "j2"]) == ["j2"]
    assert float(record(client, "j1")["lease"]) > time.time() + LEASE_S - 5


def test_finish_forgets_the_brokers_record_of_the_delivery(client: redis.Redis, jobs: WorkerJobs) -> None:
    """The delivered message is spent once its job ended: a worker killed before Celery's ack, or
    whose task thread went on taking jobs, leaves nothing unacknowledged to be delivered again."""
    submit(client, "j1")
    submit(client, "j2")
    tag = deliver(client, "j1")
    jobs.claim("j1", "w1")
    assert jobs.finish("j1", "w1", {"status": "succeeded", "output": "{}"})
    assert (
        not client.hexists(keys.KOMBU_UNACKED, tag) and client.zscore(keys.KOMBU_UNACKED_INDEX, tag) is None
    )
    other = deliver(client, "j2")  # another delivery's record stays
    assert client.hexists(keys.KOMBU_UNACKED, other)


def test_finish_stores_the_completed_body_its_worker_built_and_queues_the_delivery(
    client: redis.Redis, jobs: WorkerJobs
) -> None:
    """A job with a `completed` webhook: the worker builds the body from the record it claimed
    and the fields it ends the job with, and the finish script stores it beside the delivery's
    message (a first attempt then has nothing to freeze). The body's job is exactly the ended
    record's public view; a job without the webhook, or a finish that writes nothing, stores none."""
    hook = "http://127.0.0.1:9/hook"
    input_json = orjson.dumps({"prompt": "hi", "webhook": hook, "webhook_events_filter": ["completed"]})
    message = job_message("j1", QUEUE, 0)[0]  # any message will do: the script pushes it as it is
    for job_id in ("j1", "j2", "j3"):
        webhook = (("completed", message),) if job_id != "j2" else ()
        submit(client, job_id, input_json=input_json, webhook_messages=webhook)
        deliver(client, job_id)
    claimed = {job_id: jobs.claim(job_id, "w1").record for job_id in ("j1", "j2", "j3")}
    outcome: dict[str, str | bytes] = {
        "status": "succeeded",
        "output": b'{"text":"x"}',
        "metrics": '{"inference_ms":1}',
    }
    assert jobs.finish("j1", "w1", outcome, record=claimed["j1"])
    assert jobs.finish("j2", "w1", outcome, record=claimed["j2"])
    lapse(client, "j3")
    Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0).run_once()  # j3 is handed back: its finish is void
    assert not jobs.finish("j3", "w1", outcome, record=claimed["j3"])
    state = client.hgetall(keys.WEBHOOK_DELIVERY.format(job_id="j1", delivery="completed"))
    body = orjson.loads(state["body"])
    assert (state["url"], state["owner"], state["message"]) == (hook, OWNER, message.decode())
    assert body["type"] == "job.completed" and body["data"] == orjson.loads(
        orjson.dumps(public_job(record(client, "j1")))
    )
    assert body["data"]["status"] == "succeeded" and body["data"]["completed_at"] is not None
    assert client.lrange(keys.queue_key(keys.WEBHOOK_QUEUE, 0), 0, -1) == [message.decode()]
    for job_id in ("j2", "j3"):
        assert client.exists(keys.WEBHOOK_DELIVERY.format(job_id=job_id, delivery="completed")) == 0


def test_finish_after_a_hand_back_writes_nothing(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    deliver(client, "j1")
    jobs.claim("j1", "w1")
    lapse(client, "j1")
    Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0).run_once()
    assert not jobs.finish("j1", "w1", {"status": "succeeded", "output": "{}"})
    assert record(client, "j1")["status"] == "queued"


def test_the_commands_ahead_of_a_finish_run_before_its_script_on_its_connection(
    client: redis.Redis, jobs: WorkerJobs
) -> None:
    """A job's last output delta goes in the pipeline of its finish (workers/runtime.py), so a
    stream reader that sees the job terminal finds the delta: it must run first."""
    submit(client, "j1")
    deliver(client, "j1")
    jobs.claim("j1", "w1")
    stream = keys.job_stream("j1")
    outcome: dict[str, str | bytes] = {"status": "succeeded", "output": "{}"}

    def ahead(pipe: redis.client.Pipeline) -> None:
        pipe.xadd(stream, {"delta": "x"})

    commands = commands_while(client, lambda: jobs.finish("j1", "w1", outcome, before=ahead))
    outer = [command for command in commands if command.split()[0].upper() in ("XADD", "EVALSHA")]
    assert outer[0] == f"XADD {stream}" and outer[1].startswith("EVALSHA")
    assert client.xlen(stream) == 1 and record(client, "j1")["status"] == "succeeded"


def test_a_finish_whose_script_redis_forgot_still_ends_the_job_and_writes_ahead_once(
    client: redis.Redis, jobs: WorkerJobs
) -> None:
    """After a Redis restart the scripts are gone (NOSCRIPT): the finish loads its own again,
    and the commands ahead of it, already run, are not sent a second time."""
    submit(client, "j1")
    deliver(client, "j1")
    jobs.claim("j1", "w1")
    client.script_flush()
    stream = keys.job_stream("j1")
    outcome: dict[str, str | bytes] = {"status": "succeeded", "output": "{}"}
    assert jobs.finish("j1", "w1", outcome, before=lambda pipe: pipe.xadd(stream, {"delta": "x"}))
    assert client.xlen(stream) == 1 and record(client, "j1")["status"] == "succeeded"


def test_a_command_ahead_of_a_finish_that_fails_is_logged_and_the_job_still_ends(
    client: redis.Redis, jobs: WorkerJobs, caplog: pytest.LogCaptureFixture
) -> None:
    submit(client, "j1")
    deliver(client, "j1")
    jobs.claim("j1", "w1")
    client.set("not-a-stream", "x")
    outcome: dict[str, str | bytes] = {"status": "succeeded", "output": "{}"}
    with caplog.at_level(logging.WARNING, logger="genq.worker"):
        done = jobs.finish("j1", "w1", outcome, before=lambda pipe: pipe.xadd("not-a-stream", {"delta": "x"}))
    assert done and record(client, "j1")["status"] == "succeeded"
    assert "finish_ahead_failed" in [entry.getMessage() for entry in caplog.records]


def test_a_finish_takes_the_next_job_in_its_round_trip(client: redis.Redis, jobs: WorkerJobs) -> None:
    """A task thread that goes on to its next job sends that take right after its finish script
    (workers/runtime.py `then`): the job ends, then the next is taken and claimed, both scripts
    back to back on one connection. Each declares the keys it touches: the finish from the job's
    record, the take those of the messages next in line when the thread took its job."""
    submit(client, "j1")
    submit(client, "j2")
    job_id, claimed = jobs.take("w1", queue_lists(QUEUE)) or ("", {})
    assert job_id == "j1"
    then = NextTake("w1", queue_lists(QUEUE))
    outcome: dict[str, str | bytes] = {"status": "succeeded", "output": "{}"}
    commands = commands_while(client, lambda: jobs.finish("j1", "w1", outcome, record=claimed, then=then))
    outer = [command for command in commands if command.split()[0].upper() == "EVALSHA"]
    shas = [client.register_script(scripts.source(name)).sha for name in ("finish", "take")]
    assert outer == [f"EVALSHA {sha}" for sha in shas]
    assert record(client, "j1")["status"] == "succeeded"
    assert then.done and then.taken is not None and then.taken[0] == "j2"
    assert (record(client, "j2")["status"], record(client, "j2")["worker"]) == ("running", "w1")
    assert then.taken[1] == record(client, "j2") and client.llen(LIST) == 0


def test_a_take_after_a_finish_that_finds_nothing_says_so(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    jobs.take("w1", queue_lists(QUEUE))
    then = NextTake("w1", queue_lists(QUEUE))
    assert jobs.finish("j1", "w1", {"status": "succeeded", "output": "{}"}, then=then)
    assert then.done and then.taken is None


def test_a_take_after_a_finish_whose_scripts_redis_forgot_counts_as_not_sent(
    client: redis.Redis, jobs: WorkerJobs
) -> None:
    """After a Redis restart (NOSCRIPT for both) the finish loads its script again and ends the
    job; the take never ran, so the thread is told to take as usual, and nothing is claimed."""
    submit(client, "j1")
    submit(client, "j2")
    jobs.take("w1", queue_lists(QUEUE))
    client.script_flush()
    then = NextTake("w1", queue_lists(QUEUE))
    assert jobs.finish("j1", "w1", {"status": "succeeded", "output": "{}"}, then=then)
    assert record(client, "j1")["status"] == "succeeded"
    assert not then.done and record(client, "j2")["status"] == "queued" and client.llen(LIST) == 1


@pytest.mark.parametrize(("count_attempt", "attempts"), [(False, "0"), (True, "1")])
def test_hand_back_queues_the_job_again_with_a_fresh_deadline(
    client: redis.Redis, jobs: WorkerJobs, count_attempt: bool, attempts: str
) -> None:
    submit(client, "j1", deadline_in=1)
    tag = deliver(client, "j1")
    jobs.claim("j1", "w1")
    assert jobs.hand_back("j1", "w1", record(client, "j1"), count_attempt=count_attempt)
    rec = record(client, "j1")
    assert (rec["status"], rec["worker"], rec["attempts"]) == ("queued", "", attempts)
    assert float(rec["deadline"]) > time.time() + TIMEOUT_S - 5
    assert messages_in_list(client, "j1") == 1 and not client.hexists(keys.KOMBU_UNACKED, tag)
    assert indexed(client, "j1") == {"queued", "deadlines", "orphan_checks", "live"}


def test_hand_back_of_a_job_held_elsewhere_changes_nothing(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    deliver(client, "j1")
    jobs.claim("j1", "w1")
    before = record(client, "j1")
    assert not jobs.hand_back("j1", "w2", before, count_attempt=False)
    assert record(client, "j1") == before


# --- coalescing ------------------------------------------------------------------------------------


def test_finishing_a_leader_resolves_its_followers(client: redis.Redis, jobs: WorkerJobs) -> None:
    assert submit(client, "lead", cache_key="k") == [1]
    assert submit(client, "follow", cache_key="k") == [3, "lead"]
    assert indexed(client, "follow") == {"deadlines", "orphan_checks", "live"}  # no message: not in the queue
    deliver(client, "lead")
    jobs.claim("lead", "w1")
    assert jobs.finish("lead", "w1", {"status": "succeeded", "output": '{"text":"x"}'})
    rec = record(client, "follow")
    assert (rec["status"], rec["cached"], rec["output"]) == ("succeeded", "1", '{"text":"x"}')
    assert indexed(client, "follow") == set() and not client.exists(keys.inflight("k"))


def test_canceling_a_leader_promotes_its_oldest_follower(client: redis.Redis) -> None:
    submit(client, "lead", cache_key="k")
    submit(client, "f1", cache_key="k")
    submit(client, "f2", cache_key="k")
    script(client, "cancel")(keys=[keys.job("lead")], args=[OWNER, repr(time.time()), "lead"],
                             labels=cancel_labels("lead"))  # fmt: skip
    assert "follows" not in record(client, "f1") and messages_in_list(client, "f1") == 1
    assert "queued" in indexed(client, "f1") and "queued" not in indexed(client, "f2")
    assert record(client, "f2")["follows"] == "f1"
    assert client.get(keys.inflight("k")) == "f1"


# --- the reaper ------------------------------------------------------------------------------------


def test_reaper_requeues_a_lapsed_job(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    tag = deliver(client, "j1")
    jobs.claim("j1", "w1")
    lapse(client, "j1")
    assert Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0).run_once() == {"requeued": 1}
    rec = record(client, "j1")
    assert rec["status"] == "queued" and messages_in_list(client, "j1") == 1
    assert not client.hexists(keys.KOMBU_UNACKED, tag)


def test_reaper_fails_a_lapsed_leader_past_max_attempts_and_its_followers(
    client: redis.Redis, jobs: WorkerJobs
) -> None:
    submit(client, "lead", cache_key="k")
    submit(client, "follow", cache_key="k")
    deliver(client, "lead")
    jobs.claim("lead", "w1")
    client.hset(keys.job("lead"), "attempts", MAX_ATTEMPTS)
    lapse(client, "lead")
    assert Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0).run_once() == {"failed": 1}
    for job_id in ("lead", "follow"):
        assert orjson.loads(record(client, job_id)["error"])["type"] == "worker_lost"


def test_reaper_expires_a_follower_past_its_deadline(client: redis.Redis, jobs: WorkerJobs) -> None:
    """A stuck leader strands no follower: each has a deadline of its own."""
    submit(client, "lead", cache_key="k")
    submit(client, "follow", cache_key="k", deadline_in=-1)
    assert Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0).run_once(time.time()) == {"expired": 1}
    assert record(client, "follow")["error"] == TIMEOUT_ERROR.decode()
    assert client.lrange(keys.followers("lead"), 0, -1) == []
    assert record(client, "lead")["status"] == "queued"


def test_reaper_promotes_a_follower_whose_leader_vanished(client: redis.Redis) -> None:
    submit(client, "lead", cache_key="k")
    submit(client, "follow", cache_key="k")
    client.delete(keys.job("lead"))
    later = time.time() + scripts.ORPHAN_CHECK_S + 1
    assert Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0).run_once(later) == {"promoted": 1}
    assert "follows" not in record(client, "follow") and messages_in_list(client, "follow") == 1


@pytest.mark.parametrize("where", ["list", "unacked"])
def test_reaper_leaves_a_message_that_a_worker_will_find(client: redis.Redis, where: str) -> None:
    submit(client, "j1")
    later = time.time() + scripts.ORPHAN_CHECK_S + 1
    if where == "unacked":  # taken by a worker a moment ago
        client.zadd(keys.KOMBU_UNACKED_INDEX, {deliver(client, "j1"): later - 1})
    assert Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0).run_once(later) == {}
    assert messages_in_list(client, "j1") == (1 if where == "list" else 0)


def test_reaper_pushes_again_a_message_held_too_long_without_a_claim(client: redis.Redis) -> None:
    """A worker took the message and died before claiming the job (e.g. the hand-back message of
    its own engine's death): the message waits in kombu's unacked hash for the visibility timeout,
    past the job's deadline. Held UNACKED_STALE_S unclaimed, it is pushed again, and the stale
    entry dropped so that the broker does not hand it out as well."""
    submit(client, "j1")
    tag = deliver(client, "j1")
    reaper = Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0)
    first = time.time() + scripts.UNACKED_STALE_S + 1
    assert reaper.run_once(first) == {}  # suspect
    client.delete(keys.REAPER_LOCK)
    assert reaper.run_once(first + scripts.ORPHAN_RECHECK_S + 1) == {"repushed": 1}
    assert messages_in_list(client, "j1") == 1 and not client.hexists(keys.KOMBU_UNACKED, tag)


def test_reaper_pushes_a_lost_message_again_after_two_checks(client: redis.Redis) -> None:
    """kombu moves a message out of the list before it records it unacked: a worker killed in
    between loses it while the record says queued."""
    submit(client, "j1")
    client.rpop(LIST)  # taken, never recorded as unacked
    reaper = Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 1.0)
    first = time.time() + scripts.ORPHAN_CHECK_S + 1
    assert reaper.run_once(first) == {}  # suspect: maybe between the two steps right now
    client.delete(keys.REAPER_LOCK)
    assert reaper.run_once(first + scripts.ORPHAN_RECHECK_S + 1) == {"repushed": 1}
    assert messages_in_list(client, "j1") == 1 and record(client, "j1")["status"] == "queued"


def test_reaper_runs_in_one_process_per_period(client: redis.Redis, jobs: WorkerJobs) -> None:
    submit(client, "j1")
    deliver(client, "j1")
    jobs.claim("j1", "w1")
    lapse(client, "j1")
    first, second = Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 5.0), Reaper(client, MAX_ATTEMPTS, TIMEOUT_S, 5.0)
    assert first.run_once() == {"requeued": 1}
    assert second.run_once() == {}  # the lock is held for this period


# --- cost ------------------------------------------------------------------------------------------

#: What redis-py and this test send themselves, not the scripts' inner commands.
_OUTER_COMMANDS = {"evalsha", "eval", "script|load", "config|resetstat", "info", "ping", "hello",
                   "client|setinfo", "acl|setuser"}  # fmt: skip


def inner_commands(client: redis.Redis, run: Callable[[], Any]) -> int:
    """How many commands `run`'s scripts issue inside Redis (INFO commandstats, reset right before)."""
    client.config_resetstat()
    run()
    stats = cast(dict[str, dict[str, int]], client.info("commandstats"))
    inner = [s["calls"] for name, s in stats.items() if name.removeprefix("cmdstat_") not in _OUTER_COMMANDS]
    return sum(inner)


def test_a_plain_job_costs_few_commands_inside_the_scripts(client: redis.Redis, jobs: WorkerJobs) -> None:
    """Pins the inner commands of a plain job's submit, claim and finish (no cache, no webhook,
    no owner bounds), so a script that starts reading or writing more shows here."""
    submit(client, "warm")  # loads the scripts: no NOSCRIPT round inside the counts
    deliver(client, "warm")
    jobs.claim("warm", "w1")
    jobs.finish("warm", "w1", {"status": "succeeded", "output": "{}"})
    counts = {"submit": inner_commands(client, lambda: submit(client, "j1"))}
    # With owner bounds set, the bounds check adds its reads (HGET of the live rows, one MGET
    # over the days). The live hash costs one more write than a set would: its rows' total.
    counts["bounded submit"] = inner_commands(client, lambda: submit(client, "j2", bounds=(100, 10**9)))
    deliver(client, "j1")
    claims: list[Any] = []
    counts["claim"] = inner_commands(client, lambda: claims.append(jobs.claim("j1", "w1")))
    outcome: dict[str, str | bytes] = {"status": "succeeded", "output": "{}"}
    counts["finish"] = inner_commands(
        client, lambda: jobs.finish("j1", "w1", outcome, record=claims[0].record)
    )
    # finish: 11, two of them forgetting kombu's record of the delivery (HDEL, ZREM), three the
    # job's rows leaving its owner's live hash (HGET, HDEL, HINCRBY).
    assert counts == {"submit": 15, "bounded submit": 17, "claim": 9, "finish": 11}
    assert record(client, "j1")["status"] == "succeeded" and indexed(client, "j1") == set()
