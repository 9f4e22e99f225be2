"""kombu's Redis transport and Celery's task messages, as genq reads and writes them directly: the
one module that knows their layout (kombu 5.7, Celery 5.7, task protocol 2, the JSON serializer).

What genq writes and reads without kombu's or Celery's code, and why:
- The API publishes a job in the same Redis round trip that writes its record: submit.lua LPUSHes
  the message task_message() built, so a job is accepted with its message or not at all (an
  outbox in one step), and the event loop never blocks on kombu's synchronous producer. kombu has
  no public way to publish from inside a script; there is no fallback to Celery's apply_async
  today (it would split the record from its message: the reaper's orphan check would then be the
  only guarantee, and it pushes again through the same layout).
- A worker's task thread whose job ended takes the next job straight from the queue's lists
  (shared/jobqueue/lua/take.lua, GENQ_WORKER_TAKE_QUEUED): no broker delivery of its own. The public path
  is that setting off: every job then comes through Celery's consumer (kombu's BRPOP, its unacked
  bookkeeping, Celery's dispatch and ack). bench/take_path.py measures one against the other.
- The job store's scripts read a message's task, id and delivery tag (common.lua word_field and
  delivery_tag, take.lua task_of, webhook_take.lua delivery_of), drop a claimed job's entry from
  kombu's unacked hash and index (common.lua forget_delivery, finish.lua), and the reaper looks a
  message up there (reap_orphan.lua, reap_delivery.lua): they name those keys by the labels of
  shared/jobqueue/scripts.py CONSTANTS, whose values are these.
tests/shared/jobqueue/test_kombu_layout.py holds the contract with the pinned kombu and Celery: a message
genq's scripts write is consumed and acknowledged by kombu's public consumer, one Celery
publishes is taken by genq's scripts, and the names here are kombu's. A kombu that changes its
layout fails it.
"""

from __future__ import annotations

import base64
import datetime
import functools
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any

import orjson

from shared.ids import new_id

# --- kombu's Redis keys ---------------------------------------------------------------------------

#: kombu's hash of the messages its consumers hold unacknowledged (delivery tag -> [message,
#: exchange, routing key]), and its sorted set of the same tags scored by when each was taken (the
#: visibility timeout's sweep reads it). kombu's defaults (its unacked_key and
#: unacked_index_key transport options).
UNACKED = "unacked"
UNACKED_INDEX = "unacked_index"

#: kombu's priority steps: one list per step, which consumers BRPOP lowest step first; a queue
#: `Q`'s list of step p is `Q` for 0, else `Q` + PRIORITY_SEPARATOR + p (kombu's `sep` option).
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEPARATOR = "\x06\x16"

#: The broker transport options that make kombu use this layout (shared/celery_app.py).
TRANSPORT_OPTIONS: dict[str, Any] = {
    "priority_steps": list(PRIORITY_STEPS),
    "sep": PRIORITY_SEPARATOR,
    "queue_order_strategy": "priority",
}


def queue_key(queue: str, priority: int) -> str:
    """The Redis list holding `queue`'s messages of a kombu priority step (0 is served first)."""
    return f"{queue}{PRIORITY_SEPARATOR}{priority}" if priority else queue


def queue_of_list(queue_list: str) -> str:
    """The queue whose messages a list of queue_key() holds."""
    return queue_list.split(PRIORITY_SEPARATOR, 1)[0]


def queue_lists(queue: str) -> list[str]:
    """The Redis lists holding `queue`'s messages, in the order a worker's BRPOP names them."""
    return [queue_key(queue, priority) for priority in PRIORITY_STEPS]


# --- Celery's task messages -----------------------------------------------------------------------

#: As Celery names a sender that is not a worker (celery.utils.nodenames.anon_nodename).
_ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_BODY, _ID, _ARGSREPR, _TAG = "@genq:body@", "@genq:id@", "@genq:argsrepr@", "@genq:tag@"
_SLOT = re.compile(rb'"(@genq:[a-z]+@)"')


def task_message(
    task_name: str,
    task_id: str,
    args: list[str],
    queue: str,
    priority: int,
    *,
    retries: int = 0,
    kwargs: dict[str, Any] | None = None,
    eta: datetime.datetime | None = None,
) -> bytes:
    """A protocol-2 Celery message for kombu's Redis transport, routed straight to `queue`: what
    `send_task` writes, or with `retries`, `kwargs` and an `eta` (timezone-aware), what a task's
    retry writes (webhook deliveries publish their own retries: workers/webhooks/delivery.py)."""
    if retries or kwargs or eta is not None:
        return _retry_message(task_name, task_id, args, queue, priority, retries, kwargs or {}, eta)
    body = base64.b64encode(orjson.dumps([args, {}, _EMBED]))
    values = {
        _BODY: b'"%s"' % body,
        _ID: orjson.dumps(task_id),
        _ARGSREPR: orjson.dumps(repr(args)),
        _TAG: b'"%s"' % new_id().encode(),
    }
    pieces, slots = _envelope(task_name, queue, priority)
    out = [pieces[0]]
    for slot, piece in zip(slots, pieces[1:], strict=True):
        out += (values[slot], piece)
    return b"".join(out)


def _retry_message(
    task_name: str, task_id: str, args: list[str], queue: str, priority: int, retries: int,
    kwargs: dict[str, Any], eta: datetime.datetime | None,
) -> bytes:  # fmt: skip
    fields = _fields(task_name, queue, priority)
    fields["body"] = base64.b64encode(orjson.dumps([args, kwargs, _EMBED])).decode()
    headers, properties = fields["headers"], fields["properties"]
    headers.update(id=task_id, root_id=task_id, argsrepr=repr(args), kwargsrepr=repr(kwargs), retries=retries,
                   eta=eta.isoformat() if eta is not None else None)  # fmt: skip
    properties.update(correlation_id=task_id, delivery_tag=new_id())
    return orjson.dumps(fields)


def retagged(message: bytes | str) -> tuple[str, bytes]:
    """A message's delivery tag, and a copy of the message under a fresh tag (the reaper pushes
    a copy of a lost message: kombu keys what a worker holds by tag, so two copies in flight must
    not share one)."""
    fields = orjson.loads(message)
    tag = str(fields["properties"]["delivery_tag"])
    fields["properties"]["delivery_tag"] = new_id()
    return tag, orjson.dumps(fields)


@functools.lru_cache(maxsize=1024)
def _envelope(task_name: str, queue: str, priority: int) -> tuple[tuple[bytes, ...], tuple[str, ...]]:
    """The message's JSON cut around its per-task values: built once per task, queue and priority,
    since a message is published per job and dumping the whole envelope each time is most of its cost."""
    # Splitting on a capturing group keeps the slot names at the odd positions.
    parts = _SLOT.split(orjson.dumps(_fields(task_name, queue, priority)))
    return tuple(parts[0::2]), tuple(slot.decode() for slot in parts[1::2])


def _fields(task_name: str, queue: str, priority: int) -> dict[str, Any]:
    return {
        "body": _BODY,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": task_name,
            "id": _ID,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": _ID,
            "parent_id": None,
            "argsrepr": _ARGSREPR,
            "kwargsrepr": "{}",
            "origin": _ORIGIN,
            "ignore_result": True,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": _ID,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": priority,
            "body_encoding": "base64",
            "delivery_tag": _TAG,
        },
    }


# --- Reading them ---------------------------------------------------------------------------------

#: A message's delivery tag, however its JSON is spaced (genq's builder, kombu's restore).
_DELIVERY_TAG = re.compile(r'"delivery_tag":\s*"([^"]+)"')


def delivery_tag_of(message: bytes | str) -> str | None:
    """A message's delivery tag (kombu keys what a consumer holds by it), or None."""
    found = _DELIVERY_TAG.search(message.decode() if isinstance(message, bytes) else message)
    return found.group(1) if found else None


def task_of(message: bytes | str) -> tuple[str, str] | None:
    """A task message's task name and id (its headers'); None for anything else."""
    try:
        headers = orjson.loads(message)["headers"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(headers, dict):
        return None
    task, task_id = headers.get("task"), headers.get("id")
    return (task, task_id) if isinstance(task, str) and isinstance(task_id, str) else None


@dataclass(frozen=True, slots=True)
class TaskCall:
    """What a task message asks: the task, its id, its arguments and Celery's retry count."""

    task: str
    task_id: str
    args: list[Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    retries: int = 0


def read_task(message: bytes | str) -> TaskCall:
    """The call a task message (JSON serializer, base64 body) asks for; KeyError or ValueError
    for anything else."""
    envelope = orjson.loads(message)
    headers = envelope["headers"]
    args, kwargs, _ = orjson.loads(base64.b64decode(envelope["body"]))
    return TaskCall(str(headers["task"]), str(headers["id"]), list(args), dict(kwargs or {}),
                    int(headers.get("retries") or 0))  # fmt: skip
