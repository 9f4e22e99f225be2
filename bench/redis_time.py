"""Where Redis's time goes, script by script: each genq Lua script's time per call, from Redis's
SLOWLOG with every command logged (`slowlog-log-slower-than 0`).

INFO commandstats lumps every script under EVALSHA; the slow log keeps each call's arguments,
whose second is the script's SHA1, which names the script (shared/jobqueue/scripts.py). A call's duration
is Redis's wall time in it: on a busy 2-core host a call the kernel preempted counts its wait too,
so the median per call is the figure to compare (a preempted minority moves the mean and p99).
Logging every command costs Redis a little, so bench/machinery.py does this only when asked
(`--script-times`); the log holds the last LOG_LENGTH commands of a run.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import redis

from shared.jobqueue import scripts

#: Most commands the slow log keeps (the newest): ~66 per webhook job, ~46 per polled one.
LOG_LENGTH = 200_000


def script_names() -> dict[str, str]:
    """SHA1 -> name of every genq script, as the job store loads it (after the prelude) or bare."""
    names: dict[str, str] = {}
    for path in sorted(scripts.LUA_DIR.glob("*.lua")):
        if path.stem == "common":  # the prelude's shared functions, never run alone
            continue
        for text in (scripts.source(path.stem), scripts.plain(path.stem)):
            # Redis's name for a script, not a digest for security.
            names[hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()] = path.stem
    return names


def script_times(entries: list[Any], items: int) -> dict[str, dict[str, float]]:
    """Per script named in `entries` (SLOWLOG GET's, raw): its calls per item and its time per
    call (median, p99 and mean, in microseconds), the most time per item first."""
    names = script_names()
    durations: dict[str, list[int]] = defaultdict(list)
    for entry in entries:
        arguments = entry[3]
        if len(arguments) > 1 and bytes(arguments[0]).lower() == b"evalsha":
            sha = bytes(arguments[1]).decode()
            durations[names.get(sha, f"other:{sha[:8]}")].append(int(entry[2]))  # Celery's own, say
    report = {
        name: {
            "calls_per_item": round(len(spent) / max(1, items), 2),
            "median_us": statistics.median(spent),
            "p99_us": sorted(spent)[int(0.99 * (len(spent) - 1))],
            "mean_us": round(statistics.fmean(spent), 1),
        }
        for name, spent in durations.items()
    }
    return dict(sorted(report.items(), key=lambda kv: -kv[1]["mean_us"] * kv[1]["calls_per_item"]))


def with_script_times(
    client: redis.Redis, run: Callable[[], dict[str, Any]], items_key: str
) -> dict[str, Any]:
    """Run `run` with every command logged, and add its scripts' times (script_times) to its
    result as `redis_scripts`; the log is set back as it was after."""
    before = {str(name): str(value) for name, value in client.config_get("slowlog-*").items()}
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", LOG_LENGTH)
    client.slowlog_reset()
    try:
        result = run()
        # Raw (NEVER_DECODE): redis-py's slowlog_get decodes each entry's arguments as text.
        entries = client.execute_command("SLOWLOG", "GET", LOG_LENGTH, NEVER_DECODE=True)  # type: ignore[no-untyped-call]  # unannotated in redis-py
    finally:
        for name, value in before.items():
            client.config_set(name, value)
        client.slowlog_reset()
    result["redis_scripts"] = script_times(entries, result[items_key])
    return result


def script_rows(label: str, times: dict[str, dict[str, float]]) -> list[list[Any]]:
    """Table rows of script_times' report, each led by `label` (the run it came from)."""
    return [
        [label, name, t["calls_per_item"], t["median_us"], t["p99_us"], t["mean_us"]]
        for name, t in times.items()
    ]


SCRIPT_COLUMNS = ["run", "script", "calls/job", "median us", "p99 us", "mean us"]
