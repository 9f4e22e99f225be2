"""genq's Lua scripts: each lives in shared/jobqueue/lua/<name>.lua; the job store's run after
one prelude (`source`), the few that name only their KEYS load bare (`plain`).

Every key a script touches is declared in its KEYS, so the scripts run where keys are checked (a
Redis Cluster, a key-routing proxy, an ACL that names keys): tests/shared/jobqueue/script_keys.py
runs their table-driven tests as a Redis user allowed only each call's KEYS. A script builds no
key name: it names a key by a label, its template in shared/keys.py and the template's values
(`job_key\\x1f<job id>`), and the prelude looks the label up among the keys the call declared.

A call (`Script`, `wire`) sends its own KEYS, then every constant key (found by place), then the
declared ones; ARGV[1] counts those, their labels follow, then the script's own ARGV. A script's
text holds only the prelude's definitions it uses (`source`): each is made again on every call.
The caller declares what it knows a call will need; a key only the script can find (a follower's
record, a leader named by a key) it asks for: before its first write, it ends with a `GENQNEED`
error naming the labels, and the call is sent again with them (`Script`, `run_async`). A script
that would ask after a write fails instead (`GENQBUG`): a state half written must not be
retried; tests catch that.

`K` names the constant keys (`K.leases`), a function per key template the others
(`job_key(id)`, `owner_bytes_key(owner, day)`, ...), and `L.<template>(values)` their labels, for
the checks that ask before a write (`need`, `missing`). Then comes shared/jobqueue/lua/common.lua,
the functions the scripts share (enqueue, ended, coalescing).
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
import redis.exceptions

from shared import keys

LUA_DIR = Path(__file__).with_name("lua")

#: How often the reaper checks that a queued job's message is still where a worker finds it.
ORPHAN_CHECK_S = 30
#: A message found nowhere is checked once more after this long before it is pushed again.
ORPHAN_RECHECK_S = 5
#: A queued job's message a worker has held this long without claiming the job is pushed again
#: (its holder died): workers claim what they take at once (prefetch multiplier 1).
UNACKED_STALE_S = 30

#: Constant keys, as the scripts name them (K.<name>); every call declares them all.
CONSTANTS = {
    "leases": keys.LEASES,
    "deadlines": keys.DEADLINES,
    "orphan_checks": keys.ORPHAN_CHECKS,
    "webhook_pending": keys.WEBHOOK_PENDING,
    "webhook_queue": keys.queue_key(keys.WEBHOOK_QUEUE, 0),
    "unacked": keys.KOMBU_UNACKED,
    "unacked_index": keys.KOMBU_UNACKED_INDEX,
    "files_expiring": keys.FILES_EXPIRING,
}

#: Pub/sub channels, as the scripts name them (CH.<name>): no keys, so nothing declares them.
CHANNELS = {"job_events": keys.JOB_EVENTS_CHANNEL, "cancels": keys.CANCEL_CHANNEL}

#: Key templates, as the scripts' functions (and labels) name them.
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

#: A label naming a key by its full name: one a record holds (a job's queue list).
RAW = "key"
#: Joins a label's template and values; starts ARGV[1] (before the labels, one a line).
SEP, MARK = "\x1f", "\x1e"
#: The error a script ends with to ask for keys, before it wrote anything.
NEED = "GENQNEED "
#: Most calls of one script in a row that may ask for more keys (each round reads one level
#: further: a leader's followers, then their records).
ROUNDS = 6

#: Commands that write: after one, a script asks for no more keys (`GENQBUG`).
WRITES = (
    "HSET", "HDEL", "HINCRBY", "ZADD", "ZREM", "ZREMRANGEBYSCORE", "SADD", "SREM", "LPUSH", "RPUSH",
    "RPOP", "LREM", "SET", "DEL", "INCRBY", "DECRBY", "EXPIRE", "PEXPIRE", "PUBLISH",
)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def label(template: str, *values: object) -> str:
    """The label of a key: its template's name (TEMPLATES, CONSTANTS, or RAW with the full
    name) and the template's values, in the template's order."""
    texts = [str(value) for value in values]
    for text in texts:
        if SEP in text or MARK in text or "\n" in text:
            raise ValueError(f"a key label's value may hold no line break or separator: {text!r}")
    return SEP.join([template, *texts])


@functools.cache
def _fields(template: str) -> tuple[str, ...]:
    return tuple(field for _, field, _, _ in string.Formatter().parse(template) if field)


@functools.lru_cache(maxsize=4096)
def key_of(name: str) -> str:
    """The key a label names."""
    template, *values = name.split(SEP)
    if not values:
        return CONSTANTS[template]
    if template == RAW:
        return values[0]
    pattern = TEMPLATES[template]
    return pattern.format(**dict(zip(_fields(pattern), values, strict=True)))


def wire(
    keys_: Sequence[Any], args: Sequence[Any], labels: Sequence[str] = ()
) -> tuple[list[Any], list[Any]]:
    """KEYS and ARGV of a call of a prelude script: its own keys, every constant key (in
    CONSTANTS' order, so the prelude finds them by place) and `labels`' keys; ARGV[1] counts the
    labels, which follow it, then the script's own args."""
    if not labels:
        return [*keys_, *_CONSTANT_KEYS], [_NO_LABELS, *args]
    return [*keys_, *_CONSTANT_KEYS, *map(key_of, labels)], [f"{MARK}{len(labels)}", *labels, *args]


#: What every call declares: the constant keys; ARGV[1] of a call that declares no other key.
_CONSTANT_KEYS = tuple(CONSTANTS.values())
_NO_LABELS = MARK + "0"


def needed(error: BaseException) -> list[str] | None:
    """The labels a script asked for (its GENQNEED error), or None for any other error."""
    text = str(error)
    if not isinstance(error, redis.exceptions.ResponseError) or not text.startswith(NEED):
        return None
    # The labels, each ended by MARK: Redis appends " script: <sha>, on @user_script:<line>."
    return text[len(NEED) : text.rindex(MARK)].split(MARK)


class Script:
    """A prelude script on a blocking client, called with its own KEYS and ARGV and the labels
    of the keys the caller knows it needs; a call that asks for more is sent again with them."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self._script = client.register_script(source(name))

    @property
    def sha(self) -> str:
        return str(self._script.sha)

    @property
    def text(self) -> str:
        return str(self._script.script)

    def __call__(
        self, keys: Sequence[Any] = (), args: Sequence[Any] = (), labels: Sequence[str] = (),
        client: redis.Redis | None = None,
    ) -> Any:  # fmt: skip
        asked = list(labels)
        for _ in range(ROUNDS):
            call_keys, call_args = wire(keys, args, asked)
            try:
                return self._script(keys=call_keys, args=call_args, client=client)
            except redis.exceptions.ResponseError as exc:
                asked = _more(exc, asked)
        raise _asked_too_often(asked)

    def evalsha(self, keys: Sequence[Any], args: Sequence[Any], labels: Sequence[str] = ()) -> list[Any]:
        """EVALSHA's arguments after the command's name, for a pipeline (whose reply, should the
        script ask for keys, is an error `needed` reads: call the Script then)."""
        call_keys, call_args = wire(keys, args, labels)
        return [self.sha, len(call_keys), *call_keys, *call_args]


async def run_async(
    call: Callable[[list[Any], list[Any]], Awaitable[Any]], keys: Sequence[Any], args: Sequence[Any],
    labels: Sequence[str] = (),
) -> Any:  # fmt: skip
    """A prelude script's reply through `call(keys, args)` (an asyncio client's script runner),
    sent again with the keys it asks for."""
    asked = list(labels)
    for _ in range(ROUNDS):
        call_keys, call_args = wire(keys, args, asked)
        try:
            return await call(call_keys, call_args)
        except redis.exceptions.ResponseError as exc:
            asked = _more(exc, asked)
    raise _asked_too_often(asked)


def _more(error: redis.exceptions.ResponseError, asked: list[str]) -> list[str]:
    """`asked` and the labels a script's error asked for; the error itself when it asked none."""
    more = needed(error)
    if not more:
        raise error
    return [*asked, *more]


def _asked_too_often(asked: list[str]) -> RuntimeError:
    return RuntimeError(f"a script asked for keys {ROUNDS} times in a row: {asked}")


class AsyncScript:
    """A prelude script on an asyncio client, as Script is on a blocking one."""

    def __init__(self, client: aioredis.Redis, name: str) -> None:
        self._script = client.register_script(source(name))

    async def __call__(
        self, keys: Sequence[Any] = (), args: Sequence[Any] = (), labels: Sequence[str] = ()
    ) -> Any:
        return await run_async(self._run, keys, args, labels)

    async def _run(self, keys: list[Any], args: list[Any]) -> Any:
        return await self._script(keys=keys, args=args)


def _lua_string(text: str) -> str:
    """A Lua string literal of `text`, control characters as decimal escapes."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return "'" + "".join(f"\\{ord(char):03d}" if ord(char) < 32 else char for char in escaped) + "'"


def key_function(name: str, template: str) -> str:
    """Lua functions for one of keys.py's templates: L.<name>(values), its label, and <name>(values),
    the key the call declared under that label."""
    params = ", ".join(_fields(template))
    parts = [_lua_string(name), *_fields(template)]
    return (
        f"function L.{name}({params}) return {f' .. {_lua_string(SEP)} .. '.join(parts)} end\n"
        f"local function {name}({params}) return key(L.{name}({params})) end\n"
    )


_DECLARE = """local KEYS, ARGV = KEYS, ARGV
local DECLARED, K = {}, {}
if string.byte(ARGV[1] or '', 1) == 30 then
  local count = tonumber(string.sub(ARGV[1], 2))
  local own = #KEYS - CONSTANT_COUNT - count
  K = CONSTANT_TABLE
  local first = own + CONSTANT_COUNT
  for i = 1, count do DECLARED[ARGV[1 + i]] = KEYS[first + i] end
  KEYS = {unpack(KEYS, 1, own)}
  ARGV = {unpack(ARGV, count + 2)}
end
local WROTE = false
local server = redis
local redis = setmetatable({call = function(command, ...)
  if not WROTE and string.find(WRITES, ' ' .. command .. ' ', 1, true) then WROTE = true end
  return server.call(command, ...)
end}, {__index = server})
-- Ends the script asking for the keys `labels` (GENQNEED), or, once it wrote, as a bug.
local function undeclared(labels)
  if WROTE then error({err = 'GENQBUG keys not declared, after a write: ' .. table.concat(labels, ' ')}) end
  error({err = NEED .. table.concat(labels, '\\30') .. '\\30'})
end
-- The key the call declared under `name`.
local function key(name)
  local found = DECLARED[name]
  if found then return found end
  undeclared({name})
end
-- The labels of `labels` the call did not declare.
local function missing(labels)
  local out = {}
  for _, name in ipairs(labels) do
    if not DECLARED[name] then out[#out + 1] = name end
  end
  return out
end
-- Asks for the keys of `labels` not declared (a script does, before its first write).
local function need(labels)
  local out = missing(labels)
  if #out > 0 then undeclared(out) end
end
local L = {}
function L.key(name) return RAW .. name end
"""


@functools.cache
def prelude() -> str:
    """Everything a script may use before its own text: the per-call declarations, then every
    definition (key functions, tunables, shared/jobqueue/lua/common.lua)."""
    return _head() + "".join(text for _, text in _definitions())


@functools.cache
def source(name: str) -> str:
    """The full text of script `name`: shared/jobqueue/lua/<name>.lua after the prelude's per-call part and
    those of its definitions the script uses (directly or through another): every definition is
    made again on every call, so a script defines only what it may call."""
    body = (LUA_DIR / f"{name}.lua").read_text()
    used = set(_names(body))
    kept: list[str] = []
    for defines, text in reversed(_definitions()):  # a definition uses only those before it
        if defines & used:
            used.update(_names(text))
            kept.append(text)
    return _head() + "".join(reversed(kept)) + body


def _head() -> str:
    # One string, not a table: a table of them would be built again on every call.
    writes = _lua_string(" " + " ".join(WRITES) + " ")
    channels = ", ".join(f"{name} = {_lua_string(value)}" for name, value in CHANNELS.items())
    # K is built by one constructor (its size known up front), not key by key.
    places = ", ".join(f"{name} = KEYS[own + {place}]" for place, name in enumerate(CONSTANTS, 1))
    return (
        f"local WRITES = {writes}\nlocal NEED = {_lua_string(NEED)}\n"
        f"local CONSTANT_COUNT = {len(CONSTANTS)}\n"
        f"local RAW = {_lua_string(RAW + SEP)}\nlocal CH = {{{channels}}}\n"
        + _DECLARE.replace("CONSTANT_TABLE", f"{{{places}}}")
    )


#: A line that starts a definition, and the name it defines.
_DEFINITION = re.compile(r"^(?:local function |function L\.|local )([A-Za-z_][A-Za-z0-9_]*)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMENT = re.compile(r"--[^\n]*")


def _names(text: str) -> list[str]:
    """The names a piece of Lua mentions outside its comments."""
    return _NAME.findall(_COMMENT.sub("", text))


@functools.cache
def _definitions() -> tuple[tuple[frozenset[str], str], ...]:
    """The prelude's definitions in order, each (the names it defines, its text with the comment
    above it): the key functions, the tunables, then shared/jobqueue/lua/common.lua's."""
    builders = "".join(key_function(name, template) for name, template in TEMPLATES.items())
    tunables = (
        f"local ORPHAN_CHECK_S = {ORPHAN_CHECK_S}\nlocal ORPHAN_RECHECK_S = {ORPHAN_RECHECK_S}\n"
        f"local UNACKED_STALE_S = {UNACKED_STALE_S}\n"
        f"local LIVE_TOTAL = {_lua_string(keys.OWNER_LIVE_TOTAL)}\n"
    )
    chunks: list[tuple[set[str], list[str]]] = []
    pending: list[str] = []
    for line in (builders + tunables + (LUA_DIR / "common.lua").read_text() + "\n").splitlines(keepends=True):
        if not line.strip() or line.startswith("--"):
            pending.append(line)
        elif found := _DEFINITION.match(line):
            chunks.append(({found[1]}, [*pending, line]))
            pending = []
        elif chunks:
            chunks[-1][1].extend([*pending, line])
            pending = []
    return tuple((frozenset(defines), "".join(lines)) for defines, lines in chunks)


@functools.cache
def plain(name: str) -> str:
    """Script `name` without the prelude: for the scripts that touch only their KEYS (a batch's,
    a file's, the rate limiter's bucket, which runs so often that defining the prelude's functions
    on each call would show)."""
    return (LUA_DIR / f"{name}.lua").read_text()
