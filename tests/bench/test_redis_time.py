"""bench/redis_time.py against a real Redis: genq's scripts named by their SHA1 in the slow log,
timed per call, and the slow log's settings given back."""

from __future__ import annotations

import redis

from bench.redis_time import script_names, with_script_times
from shared import keys
from shared.jobqueue import scripts


def test_every_script_is_named_as_loaded_after_the_prelude_and_bare() -> None:
    names = script_names()
    assert set(names.values()) == {path.stem for path in scripts.LUA_DIR.glob("*.lua")} - {"common"}
    assert len(names) == 2 * len(set(names.values()))


def test_each_scripts_calls_are_counted_and_timed_and_the_log_set_back(redis_client: redis.Redis) -> None:
    take = redis_client.register_script(scripts.source("take"))
    bucket = redis_client.register_script(scripts.plain("token_bucket"))
    for script in (take, bucket):  # as genq's processes do at start (a first call's NOSCRIPT is logged too)
        redis_client.script_load(script.script)
    settings = redis_client.config_get("slowlog-*")

    def run() -> dict[str, int]:
        for _ in range(4):  # nothing queued: each take pops nothing
            take(keys=[keys.queue_key("q", 0)], args=["w", "1.0", 60, "{}", 3, "{}", keys.GENERATE_TASK, 5])
        bucket(keys=["bucket"], args=[10, 1, 1])
        redis_client.set("plain", "command")  # not a script: not in the report
        return {"jobs": 2}

    result = with_script_times(redis_client, run, "jobs")
    times = result["redis_scripts"]
    assert set(times) == {"take", "token_bucket"}
    assert times["take"]["calls_per_item"] == 2.0 and times["token_bucket"]["calls_per_item"] == 0.5
    assert all(0 < t["median_us"] <= t["p99_us"] for t in times.values())
    assert redis_client.config_get("slowlog-*") == settings
