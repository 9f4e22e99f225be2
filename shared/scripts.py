"""genq's Lua scripts: each lives in shared/lua/<name>.lua; the job store's run after one prelude
(`source`), the few that build no key names and run on every request load bare (`plain`).

The prelude is built here from shared/keys.py, so the scripts build no key names of their own:
`K` holds every constant key and channel, and one function per key template (`job_key(id)`,
`owner_bytes_key(owner, day)`, ...) builds the rest. Then comes shared/lua/common.lua, the
functions the scripts share (enqueue, ended, coalescing).
"""

from __future__ import annotations

import functools
import string
from pathlib import Path

from shared import keys

LUA_DIR = Path(__file__).with_name("lua")

#: How often the reaper checks that a queued job's message is still where a worker finds it.
ORPHAN_CHECK_S = 30
#: A message found nowhere is checked once more after this long before it is pushed again.
ORPHAN_RECHECK_S = 5
#: A queued job's message a worker has held this long without claiming the job is pushed again
#: (its holder died): workers claim what they take at once (prefetch multiplier 1).
UNACKED_STALE_S = 30

#: Constant keys and channels, as the scripts name them (K.<name>).
CONSTANTS = {
    "leases": keys.LEASES,
    "deadlines": keys.DEADLINES,
    "orphan_checks": keys.ORPHAN_CHECKS,
    "webhook_pending": keys.WEBHOOK_PENDING,
    "webhook_queue": keys.queue_key(keys.WEBHOOK_QUEUE, 0),
    "unacked": keys.KOMBU_UNACKED,
    "unacked_index": keys.KOMBU_UNACKED_INDEX,
    "job_events": keys.JOB_EVENTS_CHANNEL,
    "cancels": keys.CANCEL_CHANNEL,
    "files_expiring": keys.FILES_EXPIRING,
}

#: Key templates, as the scripts' builder functions name them.
TEMPLATES = {
    "job_key": keys.JOB,
    "followers_key": keys.FOLLOWERS,
    "inflight_key": keys.INFLIGHT,
    "running_key": keys.RUNNING,
    "queued_key": keys.QUEUED,
    "owner_live_key": keys.OWNER_LIVE,
    "owner_bytes_key": keys.OWNER_BYTES,
    "owner_file_bytes_key": keys.OWNER_FILE_BYTES,
    "webhook_delivery_key": keys.WEBHOOK_DELIVERY,
    "batch_webhook_delivery_key": keys.BATCH_WEBHOOK_DELIVERY,
    "batch_key": keys.BATCH,
    "webhook_secret_key": keys.WEBHOOK_KEY_SECRET,
    "webhook_previous_secret_key": keys.WEBHOOK_KEY_SECRET_PREVIOUS,
}


def _lua_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def key_function(name: str, template: str) -> str:
    """A Lua function building a key from one of keys.py's templates."""
    parts: list[str] = []
    params: list[str] = []
    for literal, field, _, _ in string.Formatter().parse(template):
        if literal:
            parts.append(_lua_string(literal))
        if field:
            params.append(field)
            parts.append(field)
    return f"local function {name}({', '.join(params)}) return {' .. '.join(parts)} end\n"


@functools.cache
def prelude() -> str:
    constants = ", ".join(f"{name} = {_lua_string(value)}" for name, value in CONSTANTS.items())
    builders = "".join(key_function(name, template) for name, template in TEMPLATES.items())
    tunables = (
        f"local ORPHAN_CHECK_S = {ORPHAN_CHECK_S}\nlocal ORPHAN_RECHECK_S = {ORPHAN_RECHECK_S}\n"
        f"local UNACKED_STALE_S = {UNACKED_STALE_S}\n"
        f"local LIVE_TOTAL = {_lua_string(keys.OWNER_LIVE_TOTAL)}\n"
    )
    common = (LUA_DIR / "common.lua").read_text()
    return f"local K = {{{constants}}}\n{builders}{tunables}{common}\n"


@functools.cache
def source(name: str) -> str:
    """The full text of script `name` (shared/lua/<name>.lua after the prelude)."""
    return prelude() + (LUA_DIR / f"{name}.lua").read_text()


@functools.cache
def plain(name: str) -> str:
    """Script `name` without the prelude: for scripts that build no key names and run so often
    that defining the prelude's functions on each call would show (the rate limiter's bucket)."""
    return (LUA_DIR / f"{name}.lua").read_text()
