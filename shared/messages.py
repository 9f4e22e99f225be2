"""Celery task messages, built without Celery's synchronous publisher.

The API publishes a job in the same Redis round trip that writes its record (a Lua script
LPUSHes this message), so it never blocks the event loop on kombu's synchronous producer.
The messages are what kombu's Redis transport writes for `send_task` with Celery's task
protocol 2 and the JSON serializer (the same fields and values; JSON spacing aside), so
unmodified Celery workers consume them: tests/shared/test_messages.py compares them with what
Celery publishes, and the whole suite runs real workers on them.
"""

from __future__ import annotations

import base64
import datetime
import functools
import os
import re
import socket
from typing import Any

import orjson

from shared.ids import new_id

#: As Celery names a sender that is not a worker (celery.utils.nodenames.anon_nodename).
_ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}

#: Where a message's per-task values go in its envelope (see _envelope).
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
