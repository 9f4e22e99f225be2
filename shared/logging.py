"""Structured logs: one JSON object per line. Callers log an event by name with its fields,
`log.warning("reaper_skipped", extra=fields(error=...))`; this formatter writes every record
(ours and libraries') the same way: `{"ts", "level", "logger", "event", <fields>}` for events,
`{"ts", "level", "logger", "message"}` for plain messages. The fields travel as a dict on the
record, never through text that is parsed back.

Every URL in a line is cut to its scheme, host and port: webhook URLs carry tokens in their
query, path (Slack-style hooks) or `user:password@`, Redis URLs carry passwords, and logs are
read by more people than those secrets are meant for.
"""

from __future__ import annotations

import json
import logging
import re
import time

_URL = re.compile(
    r"\b([a-z][a-z0-9+.-]{1,15}://)(?:[^\s/@\"'<>]*@)?([^\s/?#\"'<>]+)[^\s\"'<>]*", re.IGNORECASE
)
#: Libraries that log every request's full URL at INFO (httpx: "HTTP Request: POST <url>").
NOISY_LOGGERS = ("httpx", "httpcore")


def redact_urls(text: str) -> str:
    """Every URL in text as `scheme://host[:port]/…` (no credentials, path, query or fragment)."""
    return _URL.sub(lambda m: f"{m.group(1)}{m.group(2).rsplit('@', 1)[-1]}/…", text)


#: The LogRecord attribute that carries an event's fields (set through `extra=fields(...)`).
FIELDS = "genq_fields"


def fields(**values: object) -> dict[str, dict[str, object]]:
    """An event's fields, as the `extra` of a logging call."""
    return {FIELDS: values}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        event_fields = getattr(record, FIELDS, None)
        if isinstance(event_fields, dict):
            entry["event"] = record.getMessage()
            entry.update(event_fields)
        else:
            entry["message"] = record.getMessage()
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return redact_urls(json.dumps(entry, default=str))


def configure_logging(level: str) -> None:
    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
