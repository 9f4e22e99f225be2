"""Chaos soak: a real stack under random faults, then an independent check that every accepted job
ended exactly once (issue 14's proof).

    python -m bench.chaos --quick          # ~75 s: 2 APIs, 2 model workers, ~14 faults
    python -m bench.chaos                  # 600 s of faults: 2 APIs, 3 model workers, >= 200 faults
    python -m bench.chaos --duration 120 --seed 7 --out /tmp/chaos

The stack: a private Redis-compatible server (AOF on), `genq api` processes, model workers on the
placeholder-echo engine, one webhook-only worker, and a flapping webhook receiver (it answers 500 or
hangs up at random). A client submits a seeded mix (interactive/batch, with webhooks or not,
cacheable or not, some canceled). A fault injector, one fault at a time at seeded random moments,
SIGKILLs a worker, SIGTERMs one (drain), makes an engine step fail fatally (exit 70), SIGKILLs an
API, restarts Redis, or squeezes Redis's maxmemory to just above its use for a few seconds. A
supervisor restarts whatever exited after RESTART_DELAY_S, as Kubernetes would.

Then injection and submissions stop, the stack settles (until every accepted job is terminal and
its webhooks delivered, or the last job's deadline plus the bound passed), and bench/chaos_check.py,
which imports nothing of genq, checks the invariants against Redis and the receiver's log. Writes
<out>/chaos.json and <out>/chaos.png; exits 1 when an invariant is violated.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench import chaos_check as check
from bench.chaos_load import Client, Flapping, Mix, Receiver
from bench.chaos_stack import Injector, Shape, Supervisor, api_managed, set_policy, worker_managed
from bench.common import (
    BENCH_SETTINGS,
    RESULTS,
    bench_stack,
    machine,
    parse_args,
    print_table,
    run_async,
    write_report,
)
from cli.redis_server import EmbeddedRedis, free_port

MODEL = "placeholder-echo"


@dataclass(frozen=True)
class Plan:
    duration_s: float
    shape: Shape
    rate_per_s: float
    mean_fault_gap_s: float
    job_timeout_s: float
    #: The documented bound: an accepted job must be terminal by created_at + job_timeout_s +
    #: bound_s. It covers what a correct stack needs beyond the queue deadline: a run (< 1 s
    #: here), noticing a lost holder (LEASE_TTL_S 5 s plus a reaper period of 1 s), a drain
    #: (DRAIN_TIMEOUT_S 5 s), a Redis restart (<= 2 s down), and the supervisor's restart delay.
    bound_s: float = 15.0


QUICK = Plan(35.0, Shape(apis=2, model_workers=2), rate_per_s=6.0, mean_fault_gap_s=2.0, job_timeout_s=20.0)
FULL = Plan(600.0, Shape(apis=2, model_workers=3), rate_per_s=6.0, mean_fault_gap_s=1.6, job_timeout_s=60.0)
DRAIN_TIMEOUT_S = 5.0
LEASE_TTL_S = 5.0
REAPER_INTERVAL_S = 1.0
MAX_ATTEMPTS = 3
WEBHOOK_TIMEOUT_S = 2.0
WEBHOOK_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)
STARTUP_TIMEOUT_S = 120.0


def stack_settings(plan: Plan, redis_url: str, scratch: Path, secret: str) -> dict[str, str]:
    """GENQ_* settings (without the prefix) shared by every process of the stack."""
    return {
        **BENCH_SETTINGS,
        "LOG_LEVEL": "INFO",  # the logs are the evidence when an invariant fails
        "REDIS_URL": redis_url,
        "DATA_DIR": str(scratch / "genq"),
        "MODEL": MODEL,
        "PLACEHOLDER_STEP_S": "0.01",
        "JOB_TIMEOUT_S": str(plan.job_timeout_s),
        # A killed worker's messages come back after this long unless a lease and the reaper hand
        # them back sooner (webhook deliveries have no reaper: a killed webhook worker's come back
        # only then). Above the job timeout, as the settings require, and above a webhook
        # attempt's claim lease (timeout + 30 s), as in production (1800 s): at 30 s, restored
        # copies of a dead worker's deliveries arrived while that lease held and were dropped as
        # stale, losing the delivery (see bench/README.md).
        "VISIBILITY_TIMEOUT_S": str(visibility_timeout_s(plan)),
        "HEARTBEAT_INTERVAL_S": "0.5",
        "HEARTBEAT_TTL_S": "3",
        # A lost worker's jobs are handed back once their lease lapses (the reaper looks each
        # second): short, so recoveries fit in the bound below.
        "LEASE_TTL_S": str(LEASE_TTL_S),
        "REAPER_INTERVAL_S": str(REAPER_INTERVAL_S),
        "MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        "DRAIN_TIMEOUT_S": str(DRAIN_TIMEOUT_S),
        "WEBHOOK_SECRET": secret,
        "WEBHOOK_ALLOW_PRIVATE": "1",
        "WEBHOOK_TIMEOUT_S": str(WEBHOOK_TIMEOUT_S),
        "WEBHOOK_RETRY_DELAYS_S": ",".join(str(d) for d in WEBHOOK_RETRY_DELAYS_S),
    }


def visibility_timeout_s(plan: Plan) -> int:
    return int(plan.job_timeout_s * 2)


def fault_kinds() -> list[str]:
    """Every kind, but engine_fatal only where this checkout's settings have the fault hook
    (GENQ_FAULT_ENGINE_FATAL_FILE): without it the touched file would do nothing."""
    from bench.chaos_stack import FAULT_WEIGHTS
    from shared.config import Settings

    kinds = list(FAULT_WEIGHTS)
    if "fault_engine_fatal_file" not in Settings.model_fields:
        kinds.remove("engine_fatal")
    return kinds


# --- The run ------------------------------------------------------------------------------------


@dataclass
class Run:
    """What a soak leaves for the checker and the report."""

    t0: float
    chaos_s: float
    settle: dict[str, Any]
    kinds: list[str]
    client: Client
    injector: Injector
    supervisor: Supervisor
    receiver: Receiver
    left_dead: list[str]
    logs: Path


async def soak(plan: Plan, seed: int, scratch: Path, redis_server: EmbeddedRedis) -> Run:
    await set_policy(redis_server.url)
    key = os.urandom(24)
    secret = "whsec_" + base64.b64encode(key).decode()
    settings = stack_settings(plan, redis_server.url, scratch, secret)
    receiver = Receiver(scratch / "webhooks.jsonl", key, Flapping(hang_s=2 * WEBHOOK_TIMEOUT_S), seed + 1)
    receiver.start()
    supervisor = Supervisor(redis_server)
    ports = [free_port() for _ in range(plan.shape.apis)]
    try:
        return await _soak(plan, seed, scratch, settings, supervisor, receiver, ports)
    finally:
        supervisor.stop_all()
        await supervisor.close()
        receiver.stop()


async def _soak(plan: Plan, seed: int, scratch: Path, settings: dict[str, str], supervisor: Supervisor,
                receiver: Receiver, ports: list[int]) -> Run:  # fmt: skip
    for index in range(plan.shape.model_workers):
        supervisor.add(worker_managed(f"worker-{index}", "model_worker", settings, scratch, None))
    supervisor.add(worker_managed("webhook-worker", "webhook_worker", settings, scratch, "webhooks"))
    for index, port in enumerate(ports):
        supervisor.add(api_managed(f"api-{index}", port, settings, scratch))
    started = time.time()
    if still_down := await supervisor.wait_all_up(STARTUP_TIMEOUT_S):
        raise RuntimeError(f"not up after {STARTUP_TIMEOUT_S} s: {still_down}")
    print(f"stack up in {time.time() - started:.1f} s; injecting faults for {plan.duration_s:g} s")
    client = Client(ports, receiver.url, Mix(plan.rate_per_s), seed)
    kinds = fault_kinds()
    injector = Injector(supervisor, seed + 2, plan.mean_fault_gap_s, DRAIN_TIMEOUT_S, kinds)
    stop = asyncio.Event()
    supervising = asyncio.create_task(supervisor.run(stop))
    t0 = time.time()
    try:
        await asyncio.gather(client.run(t0 + plan.duration_s), injector.run(t0 + plan.duration_s))
        chaos_end = time.time()
        print(f"faults stopped after {len(injector.faults)}; settling")
        settle = await settle_jobs(plan, settings["REDIS_URL"], client, receiver)
    finally:
        stop.set()
        await supervising
        await client.close()
    left_dead = await supervisor.wait_all_up(30.0)  # after the loop stopped: one ticker at a time
    return Run(t0, round(chaos_end - t0, 1), settle, kinds, client, injector, supervisor, receiver,
               left_dead, scratch)  # fmt: skip


async def settle_jobs(plan: Plan, redis_url: str, client: Client, receiver: Receiver) -> dict[str, Any]:
    """Wait until every accepted job is terminal and each one with a webhook has a 2xx job.completed
    in the receiver's log, or until the last job's due time (deadline + bound), or a killed webhook
    worker's deliveries' return (the visibility timeout), plus the webhook retry schedule, has
    passed. Returns how long that took; the checker judges what it finds."""
    began = time.time()
    webhook_slack = sum(WEBHOOK_RETRY_DELAYS_S) + (len(WEBHOOK_RETRY_DELAYS_S) + 1) * WEBHOOK_TIMEOUT_S
    give_up = began + max(plan.job_timeout_s + plan.bound_s, visibility_timeout_s(plan)) + webhook_slack
    pending = {job.id: job.webhook for job in client.jobs}
    redis_client = aioredis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
    try:
        while pending and time.time() < give_up:
            await asyncio.sleep(1.0)
            statuses = await _statuses(redis_client, list(pending))
            delivered = _delivered_completions(receiver.log_path)
            pending = {
                job_id: webhook
                for job_id, webhook in pending.items()
                if statuses[job_id] not in check.TERMINAL or (webhook and job_id not in delivered)
            }
    finally:
        await redis_client.aclose()
    return {"settle_s": round(time.time() - began, 1), "unsettled": len(pending)}


async def _statuses(client: aioredis.Redis, job_ids: list[str]) -> dict[str, str | None]:
    async with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(f"genq:job:{job_id}", "status")
        return dict(zip(job_ids, await pipe.execute(), strict=True))


def _delivered_completions(log_path: Path) -> set[str]:
    return {
        str(d["job_id"])
        for d in check.read_deliveries(log_path)
        if d["type"] == "job.completed" and d["answered"] is not None and 200 <= d["answered"] < 300
    }


# --- Checking and reporting -------------------------------------------------------------------------


def judge(plan: Plan, redis_url: str, run: Run) -> dict[str, Any]:
    """Run every check; the report's verdicts, counts and evidence."""
    jobs = run.client.jobs_json()
    records = check.read_records(redis_url, [job["id"] for job in jobs])
    verdicts = check.Verdicts(check.INVARIANTS)
    limits = check.Limits(plan.job_timeout_s, plan.bound_s, LEASE_TTL_S, REAPER_INTERVAL_S, MAX_ATTEMPTS)
    past_queue_due = check.check_jobs(jobs, records, limits, verdicts)
    webhooks = check.check_webhooks(jobs, records, check.read_deliveries(run.receiver.log_path), verdicts)
    exits = [exit_.__dict__ for exit_ in run.supervisor.exits]
    check_answers_and_processes(run, exits, verdicts)
    invariants = verdicts.as_json()
    failed = check.failed_examples(jobs, records)
    examples = [e for item in invariants.values() for e in item["examples"] if "job_id" in e]
    annotate([*examples, *failed], redis_url, exits, run.injector.faults, run.t0)
    lines = check.log_lines(run.logs, [e["job_id"] for e in [*examples, *failed]])
    for example in [*examples, *failed]:
        example["log_lines"] = lines[example["job_id"]]
    return {
        "invariants": invariants,
        "violations": sum(item["violations"] for item in invariants.values()),
        "jobs": {**check.job_counts(jobs, records), "started_then_past_queue_due": past_queue_due},
        "failed_examples": failed,
        "unknown_records": check.unknown_records(redis_url, {job["id"] for job in jobs}),
        "answers": run.client.report(),
        "webhooks": webhooks,
        "faults": fault_summary(run.injector.faults, run.t0),
        "processes": process_summary(run, exits),
        "timeline": timeline(jobs, records, run.t0),
    }


def check_answers_and_processes(run: Run, exits: list[dict[str, Any]], verdicts: check.Verdicts) -> None:
    for example in run.client.answers.bare_5xx:
        verdicts.fail("no_bare_5xx", example)
    for name in run.left_dead:
        verdicts.fail("no_process_left_dead", {"process": name})
    for exit_ in exits:
        if exit_["fault"] is None and not exit_["while_starting"]:
            at = exit_["at"]
            before = [f.as_json(run.t0) for f in run.injector.faults if at - 10 <= f.at <= at]
            verdicts.fail("no_unexpected_exits", {**exit_, "at_s": round(at - run.t0, 3),
                                                  "faults_in_10_s_before": before})  # fmt: skip


def process_summary(run: Run, exits: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "exits": [{**e, "at_s": round(e["at"] - run.t0, 3)} for e in exits],
        "restarts": {m.name: m.restarts for m in run.supervisor.processes},
        "failed_starts": sum(1 for e in exits if e["fault"] is None and e["while_starting"]),
        "redis_unexpected_restarts": run.supervisor.redis_restarts_unexpected,
    }


def annotate(examples: list[dict[str, Any]], redis_url: str, exits: list[dict[str, Any]], faults: list[Any],
             t0: float) -> None:  # fmt: skip
    """Add to each example job what explains it: where its task message is, the exit of the process
    that held it (genq's worker ids are host:pid:suffix), and the faults injected around it."""
    where = check.message_whereabouts(redis_url, [e["job_id"] for e in examples])
    webhooks = check.delivery_states(redis_url, [e["job_id"] for e in examples if e["webhook"]])
    by_pid = {e["pid"]: e for e in exits if e["pid"] is not None}
    for example in examples:
        record = example["record"]
        example["message_in"] = where[example["job_id"]]
        if example["webhook"]:
            example["webhook_state"] = webhooks[example["job_id"]]
        holder = (record.get("worker") or "").split(":")
        if len(holder) == 3 and holder[1].isdigit() and int(holder[1]) in by_pid:
            held = by_pid[int(holder[1])]
            example["holder_exit"] = {k: held[k] for k in ("name", "pid", "code", "fault", "note")}
            example["holder_exit"]["at_s"] = round(held["at"] - t0, 3)
        created = float(record.get("created_at") or example["submitted_at"])
        ended = float(record.get("completed_at") or created + 10)
        example["created_at_s"] = round(created - t0, 3)
        example["faults_around"] = [f.as_json(t0) for f in faults if created - 3 <= f.at <= ended + 3][:8]


def fault_summary(faults: list[Any], t0: float) -> dict[str, Any]:
    by_kind: dict[str, list[float]] = {}
    for fault in faults:
        recovery = by_kind.setdefault(fault.kind, [])
        if fault.recovered_at is not None:
            recovery.append(fault.recovered_at - fault.at)
    return {
        "total": len(faults),
        "by_kind": {kind: len([f for f in faults if f.kind == kind]) for kind in sorted(by_kind)},
        "recovery_s": {kind: _spread(values) for kind, values in sorted(by_kind.items())},
        "list": [fault.as_json(t0) for fault in faults],
    }


def _spread(values: list[float]) -> dict[str, float | int | None]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": None, "max": None}
    return {"n": len(ordered), "p50": round(ordered[len(ordered) // 2], 2), "max": round(ordered[-1], 2)}


def timeline(jobs: list[dict[str, Any]], records: dict[str, dict[str, str]], t0: float) -> dict[str, Any]:
    """Per second from t0: jobs accepted, jobs that became terminal, and jobs in flight (accepted,
    not yet terminal), from the records' own timestamps."""
    created, completed = [], []
    for job in jobs:
        record = records.get(job["id"]) or {}
        created.append(float(record.get("created_at") or job["accepted_at"]) - t0)
        if record.get("completed_at"):
            completed.append(float(record["completed_at"]) - t0)
    horizon = int(max([*created, *completed, 0.0])) + 1
    accepted_per_s, completed_per_s = [0] * horizon, [0] * horizon
    for value in created:
        accepted_per_s[max(0, int(value))] += 1
    for value in completed:
        completed_per_s[max(0, int(value))] += 1
    in_flight, running = [], 0
    for second in range(horizon):
        running += accepted_per_s[second] - completed_per_s[second]
        in_flight.append(running)
    return {"accepted_per_s": accepted_per_s, "completed_per_s": completed_per_s, "in_flight": in_flight}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    line = report["timeline"]
    seconds = range(len(line["in_flight"]))
    figure, (rates, flight) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    rates.plot(seconds, line["completed_per_s"], color="black", label="jobs terminal / s", linewidth=0.9)
    rates.plot(seconds, line["accepted_per_s"], color="grey", label="jobs accepted / s", linewidth=0.9)
    flight.plot(seconds, line["in_flight"], color="black", label="in flight (accepted, not terminal)")
    for axis in (rates, flight):
        axis.axvline(report["chaos_s"], color="black", linestyle="--", linewidth=0.8)  # faults stop here
    colors = dict(zip(sorted(report["faults"]["by_kind"]), [f"C{i}" for i in range(10)], strict=False))
    for kind, color in colors.items():
        moments = [f["at_s"] for f in report["faults"]["list"] if f["kind"] == kind]
        for axis in (rates, flight):
            axis.vlines(moments, 0, 1, transform=axis.get_xaxis_transform(), colors=[color], alpha=0.5,
                        linewidth=0.8, label=kind if axis is rates else None)  # fmt: skip
    rates.set(ylabel="jobs per second", title=f"Chaos soak: {report['faults']['total']} faults, "
              f"{report['jobs']['accepted']} jobs, {report['violations']} violations")  # fmt: skip
    flight.set(
        xlabel="seconds since traffic and faults began (dashed: faults stop, the stack settles)",
        ylabel="jobs",
    )
    rates.legend(fontsize=7, ncol=4, loc="upper right")
    flight.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def print_summary(report: dict[str, Any]) -> None:
    jobs, faults = report["jobs"], report["faults"]
    print_table("Faults", ["kind", "injected", "recovery p50 s", "recovery max s"],
                [[kind, count, faults["recovery_s"][kind]["p50"], faults["recovery_s"][kind]["max"]]
                 for kind, count in faults["by_kind"].items()])  # fmt: skip
    print_table(
        "Jobs",
        ["accepted", *jobs["by_status"], "failed by type"],
        [[jobs["accepted"], *jobs["by_status"].values(), json.dumps(jobs["failed_by_error_type"])]],
    )
    print_table("Invariants", ["invariant", "violations"],
                [[name, item["violations"]] for name, item in report["invariants"].items()])  # fmt: skip
    print(f"answers: {json.dumps(report['answers']['submissions_by_status'])}; refused "
          f"{report['answers']['connections_refused']}; transport errors "
          f"{json.dumps(report['answers']['transport_errors'])}")  # fmt: skip
    print(f"failed with `timeout` after they had started (handed back, not rerun in time): "
          f"{jobs['timed_out_after_start']}")  # fmt: skip
    unknown = report["unknown_records"]
    print(f"records the client never learned of: {unknown['count']} {json.dumps(unknown['by_status'])}")
    print(f"{'FAIL' if report['violations'] else 'PASS'}: {report['violations']} invariant violations")


def more_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds of faults and traffic (default 600; 35 with --quick)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1, help="seed of the mix, the faults and the receiver")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__, "chaos", argv, more_args)
    plan = QUICK if args.quick else FULL
    if args.duration is not None:
        plan = Plan(args.duration, plan.shape, plan.rate_per_s, plan.mean_fault_gap_s, plan.job_timeout_s)
    report: dict[str, Any] = {"quick": args.quick, "seed": args.seed, "machine": machine(), "model": MODEL,
                              "plan": {**plan.__dict__, "shape": plan.shape.__dict__}}  # fmt: skip
    with bench_stack("chaos") as (stack, scratch):
        redis_server = EmbeddedRedis(scratch / "redis", appendonly=True)
        redis_server.start()
        stack.callback(redis_server.stop)
        run = run_async(soak(plan, args.seed, scratch, redis_server))
        report |= {"fault_kinds": run.kinds, "chaos_s": run.chaos_s, "settle": run.settle}
        report |= judge(plan, redis_server.url, run)
        if report["violations"]:
            report["logs_kept_in"] = str(keep_logs(scratch, args.out))
    print_summary(report)
    write_report(args.out, "chaos", report, plot)
    return report


def keep_logs(scratch: Path, out: Path) -> Path:
    """On a violation the processes' logs and the receiver's log are the evidence: keep them, beside
    the report, except in the committed results folder (they would be tens of MB of noise in git):
    there, in a temporary folder."""
    import shutil

    target = out / "chaos-logs"
    if out.resolve() == RESULTS.resolve():
        target = Path(tempfile.mkdtemp(prefix="genq-chaos-logs-"))
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(scratch, target, ignore=shutil.ignore_patterns("*.aof", "appendonlydir", "*.rdb"))
    print(f"logs kept in {target}")
    return target


if __name__ == "__main__":
    sys.exit(1 if main()["violations"] else 0)
