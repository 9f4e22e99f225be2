"""The chaos soak's invariant checker. It is independent of genq's code on purpose: it reads the job
records with plain redis-py (`HGETALL genq:job:<id>`, the documented record layout), the webhook
receiver's own log, and the client's and supervisor's records. Nothing here imports genq, so a bug
in genq's store cannot hide itself from the check.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.chaos_load import echo_text

TERMINAL = frozenset({"succeeded", "failed", "canceled"})
#: Examples kept per violated invariant (the counts are complete).
EXAMPLES = 20


@dataclass(frozen=True)
class Limits:
    """What "in time" means. A job that never started must be terminal by created_at +
    job_timeout_s + bound_s (the queue deadline). A job that started may be handed back (a lost
    worker, a drain) with a fresh queue deadline; README's contract for it is max_attempts x
    (job timeout + lease + reaper period), plus the queue wait of each hand-back (each at most a
    job timeout), after its start, itself within a job timeout of created_at."""

    job_timeout_s: float
    bound_s: float
    lease_ttl_s: float
    reaper_interval_s: float
    max_attempts: int

    def due(self, record: dict[str, str]) -> float:
        created = float(record["created_at"])
        if not started(record):
            return created + self.job_timeout_s + self.bound_s
        per_attempt = 2 * self.job_timeout_s + self.lease_ttl_s + self.reaper_interval_s
        return created + self.job_timeout_s + self.max_attempts * per_attempt + self.bound_s


def started(record: dict[str, str]) -> bool:
    """Ever claimed by a worker: the claim writes `worker` (a hand-back empties it, never removes
    it) and counts an attempt."""
    return "worker" in record or record.get("attempts", "0") != "0"


def read_records(redis_url: str, job_ids: list[str]) -> dict[str, dict[str, str]]:
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)
    try:
        records: dict[str, dict[str, str]] = {}
        for start in range(0, len(job_ids), 500):
            pipe = client.pipeline(transaction=False)
            chunk = job_ids[start : start + 500]
            for job_id in chunk:
                pipe.hgetall(f"genq:job:{job_id}")
            records.update(zip(chunk, pipe.execute(), strict=True))
        return records
    finally:
        client.close()


def read_deliveries(log_path: Path) -> list[dict[str, Any]]:
    if not log_path.exists():
        return []
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]


class Verdicts:
    """Per invariant: how many violations, and the first few with their evidence."""

    def __init__(self, names: Iterable[str]) -> None:
        self.counts: dict[str, int] = dict.fromkeys(names, 0)
        self.examples: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def fail(self, name: str, evidence: dict[str, Any]) -> None:
        self.counts[name] += 1
        if len(self.examples[name]) < EXAMPLES:
            self.examples[name].append(evidence)

    def as_json(self) -> dict[str, Any]:
        return {
            name: {"ok": count == 0, "violations": count, "examples": self.examples.get(name, [])}
            for name, count in self.counts.items()
        }


INVARIANTS = (
    "no_lost_jobs",  # every accepted job has a record
    "no_stuck_jobs",  # every accepted job is terminal at the end
    "terminal_in_time",  # ... by created_at + job timeout + bound
    "succeeded_exactly_once",  # one output, the right one, and no error beside it
    "one_completion_webhook",  # one job.completed webhook-id per job, delivered with 2xx, true status
    "no_bare_5xx",
    "no_process_left_dead",
    "no_unexpected_exits",
)


def evidence(job: dict[str, Any], record: dict[str, str]) -> dict[str, Any]:
    """What the report shows about one job: the client's view and the record's key fields."""
    fields = ("status", "worker", "attempts", "created_at", "started_at", "completed_at", "deadline",
              "error", "follows", "cached")  # fmt: skip
    return {"job_id": job["id"], "submitted_at": job["submitted_at"], "webhook": job["webhook"],
            "cacheable": job["cacheable"], "cancel_requested_at": job["cancel_requested_at"],
            "record": {name: record.get(name) for name in fields if name in record}}  # fmt: skip


def check_jobs(jobs: list[dict[str, Any]], records: dict[str, dict[str, str]], limits: Limits,
               verdicts: Verdicts) -> int:  # fmt: skip
    """Check each accepted job's record; returns how many jobs that had started ended later than
    the never-started jobs' due time (allowed by the contract, but shown)."""
    past_queue_due = 0
    for job in jobs:
        record = records.get(job["id"]) or {}
        if not record:
            verdicts.fail("no_lost_jobs", evidence(job, record))
            continue
        if record.get("status") not in TERMINAL:
            verdicts.fail("no_stuck_jobs", evidence(job, record))
            continue
        completed, due = float(record.get("completed_at") or "inf"), limits.due(record)
        if completed > due:
            verdicts.fail("terminal_in_time", {**evidence(job, record), "due": due})
        past_queue_due += completed > float(record["created_at"]) + limits.job_timeout_s + limits.bound_s
        if record["status"] == "succeeded":
            check_output(job, record, verdicts)
    return past_queue_due


def check_output(job: dict[str, Any], record: dict[str, str], verdicts: Verdicts) -> None:
    try:
        text = json.loads(record.get("output") or "null")["text"]
    except (ValueError, TypeError, KeyError):
        text = None
    expected = echo_text(job["prompt"], job["max_tokens"])
    if text != expected or record.get("error"):
        verdicts.fail("succeeded_exactly_once", {**evidence(job, record), "output": record.get("output"),
                                                 "expected_text": expected})  # fmt: skip


def check_webhooks(jobs: list[dict[str, Any]], records: dict[str, dict[str, str]],
                   deliveries: list[dict[str, Any]], verdicts: Verdicts) -> dict[str, Any]:  # fmt: skip
    """Every terminal job that asked for webhooks got exactly one job.completed webhook-id, delivered
    with a 2xx, carrying the job's final status, signed. The same webhook-id arriving again is a
    retry (allowed: receivers deduplicate on it) and only counted."""
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for delivery in deliveries:
        by_job[str(delivery.get("job_id"))].append(delivery)
    redundant = 0
    for job in jobs:
        record = records.get(job["id"]) or {}
        if not job["webhook"] or record.get("status") not in TERMINAL:
            continue
        completed = [d for d in by_job[job["id"]] if d["type"] == "job.completed"]
        ids = {d["webhook_id"] for d in completed}
        delivered = [d for d in completed if d["answered"] is not None and 200 <= d["answered"] < 300]
        redundant += max(0, len(delivered) - 1)
        problem = None
        if len(ids) != 1:
            problem = f"{len(ids)} distinct job.completed webhook-ids"
        elif not delivered:
            problem = "job.completed never answered 2xx"
        elif delivered[0]["status"] != record["status"]:
            problem = f"job.completed says {delivered[0]['status']}, the record says {record['status']}"
        elif not all(d["signature_ok"] for d in completed):
            problem = "a job.completed signature does not verify"
        if problem:
            verdicts.fail("one_completion_webhook", {**evidence(job, record), "problem": problem,
                                                     "deliveries": completed[:6]})  # fmt: skip
    answered = Counter(str(d["answered"]) for d in deliveries)
    return {
        "requests_received": len(deliveries),
        "answered": dict(answered),
        "by_type": dict(Counter(str(d["type"]) for d in deliveries)),
        "redundant_2xx_completed": redundant,
        "bad_signatures": sum(1 for d in deliveries if not d["signature_ok"]),
    }


def job_counts(jobs: list[dict[str, Any]], records: dict[str, dict[str, str]]) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    attempts: Counter[str] = Counter()
    timed_out_after_start = 0
    for job in jobs:
        record = records.get(job["id"]) or {}
        statuses[record.get("status", "missing")] += 1
        attempts[record.get("attempts", "?")] += 1
        if record.get("status") == "failed":
            error_type = _error_type(record)
            errors[error_type] += 1
            # "reached its deadline before it ran", said of a job that had started: it was handed
            # back (or lost) and not run again in time. Allowed (terminal), but worth a look.
            timed_out_after_start += error_type == "timeout" and record.get("attempts", "0") != "0"
    return {
        "accepted": len(jobs),
        "by_status": dict(statuses),
        "failed_by_error_type": dict(errors),
        "cached": sum(1 for job in jobs if (records.get(job["id"]) or {}).get("cached") == "1"),
        "with_webhook": sum(1 for job in jobs if job["webhook"]),
        "cancel_requested": sum(1 for job in jobs if job["cancel_requested_at"] is not None),
        "by_attempts": dict(sorted(attempts.items())),
        "timed_out_after_start": timed_out_after_start,
    }


def _error_type(record: dict[str, str]) -> str:
    try:
        return str(json.loads(record["error"])["type"])
    except (ValueError, TypeError, KeyError):
        return "unreadable"


def message_whereabouts(redis_url: str, job_ids: list[str]) -> dict[str, list[str]]:
    """Where each job's task messages are now (its generation task, its webhook deliveries): which
    queue lists (kombu keeps a queue `Q` in lists `Q` and `Q\\x06\\x16<priority>`; model queues are
    `genq.<model>`, webhook deliveries `webhooks`) and whether the unacked hash (messages a worker
    took and has not acknowledged) holds one. A non-terminal job whose message is nowhere can never
    finish."""
    client = redis.Redis.from_url(redis_url, socket_timeout=30)
    try:
        places: dict[str, list[bytes | str]] = {}
        for pattern in (b"genq.*", b"webhooks*"):
            for key in client.scan_iter(match=pattern, count=1000):
                if client.type(key) == b"list":
                    places[key.decode(errors="replace")] = client.lrange(key, 0, -1)
        places["unacked"] = list(client.hvals("unacked"))
    finally:
        client.close()
    return {
        job_id: [name for name, messages in places.items() if any(job_id in str(m) for m in messages)]
        for job_id in job_ids
    }


def failed_examples(jobs: list[dict[str, Any]], records: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """A few failed jobs of each error type, with their evidence: not invariant violations (a job
    may fail), but a `timeout` or `worker_lost` under faults says where a job waited or was lost."""
    kept: Counter[str] = Counter()
    examples = []
    for job in jobs:
        record = records.get(job["id"]) or {}
        if record.get("status") != "failed":
            continue
        error_type = _error_type(record)
        kept[error_type] += 1
        if kept[error_type] <= 5:
            examples.append({**evidence(job, record), "error_type": error_type})
    return examples


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def log_lines(logs: Path, job_ids: list[str], per_job: int = 8) -> dict[str, list[str]]:
    """The first lines of the processes' logs that name each job (one pass over every log)."""
    wanted = set(job_ids)
    found: dict[str, list[str]] = {job_id: [] for job_id in job_ids}
    for path in sorted(logs.glob("*.log")):
        with path.open(errors="replace") as log:
            for line in log:
                for job_id in set(_UUID.findall(line)) & wanted:
                    if len(found[job_id]) < per_job:
                        found[job_id].append(f"{path.stem}: {line.strip()[:400]}")
    return found


def unknown_records(redis_url: str, known: set[str]) -> dict[str, Any]:
    """Job records the client never learned of (its request was cut off, or answered with an
    error after the record was written): not accepted, so no invariant covers them, but one that is
    still queued or running after settling is a job in limbo all the same."""
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)
    try:
        ids = [str(key).split(":", 2)[2] for key in client.scan_iter(match="genq:job:*", count=1000)]
        unknown = [job_id for job_id in ids if _UUID.fullmatch(job_id) and job_id not in known]
        statuses = [client.hget(f"genq:job:{job_id}", "status") for job_id in unknown]
    finally:
        client.close()
    limbo = [job_id for job_id, status in zip(unknown, statuses, strict=True) if status not in TERMINAL]
    return {
        "count": len(unknown),
        "by_status": dict(Counter(str(s) for s in statuses)),
        "not_terminal": limbo[:20],
    }


def delivery_states(redis_url: str, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each job's webhook state in Redis: the completed delivery's hash (genq:job:<id>:webhook:
    completed, without its body) and any webhook message still waiting in the record to be pushed
    (a `webhook_message:<event>` field: the event was never enqueued)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=30)
    try:
        states = {}
        for job_id in job_ids:
            delivery = client.hgetall(f"genq:job:{job_id}:webhook:completed")
            delivery.pop("body", None)
            fields = [str(field) for field in client.hkeys(f"genq:job:{job_id}")]
            waiting = [field for field in fields if field.startswith("webhook_message:")]
            states[job_id] = {"completed_delivery": delivery, "never_enqueued": waiting}
        return states
    finally:
        client.close()
