"""Celery task messages, built without Celery's synchronous publisher.

The API publishes a job in the same Redis round trip that writes its record (a Lua script
LPUSHes this message), so it never blocks the event loop on kombu's synchronous producer.
The bytes are exactly what kombu's Redis transport writes for `send_task` with Celery's
task protocol 2 and the JSON serializer, so unmodified Celery workers consume them
(tests/shared/test_messages.py compares against kombu's own output; the whole suite runs
real workers on them).
"""

from __future__ import annotations

import base64
import os
import socket
import uuid

import orjson

_ORIGIN = f"{os.getpid()}@{socket.gethostname()}"
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def task_message(task_name: str, task_id: str, args: list[str], queue: str, priority: int) -> bytes:
    """A protocol-2 Celery message for kombu's Redis transport, routed straight to `queue`."""
    body = orjson.dumps([args, {}, _EMBED])
    envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": task_name,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": repr(args),
            "kwargsrepr": "{}",
            "origin": _ORIGIN,
            "ignore_result": True,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": priority,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return orjson.dumps(envelope)
