"""shared/logging.py: one JSON object per line, events with their fields at the top level, plain
messages as `message`, tracebacks kept, URLs cut to scheme and host (the redaction cases live in
tests/shared/test_secrets.py)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path

from shared.logging import FIELDS, NOISY_LOGGERS, JsonFormatter, configure_logging, fields


def _record(message: str, extra: Mapping[str, object] | None = None, exc: bool = False) -> logging.LogRecord:
    record = logging.LogRecord("genq.test", logging.WARNING, __file__, 1, message, None, None)
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            record.exc_info = sys.exc_info()
    for name, value in (extra or {}).items():
        setattr(record, name, value)
    return record


def test_an_event_is_one_json_line_with_its_fields_at_the_top() -> None:
    line = JsonFormatter().format(_record("job_failed", fields(job_id="j1", attempts=2)))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["event"] == "job_failed" and entry["job_id"] == "j1" and entry["attempts"] == 2
    assert entry["level"] == "WARNING" and entry["logger"] == "genq.test"
    assert "message" not in entry
    assert entry["ts"].endswith("Z") and len(entry["ts"]) == len("2026-12-01T19:41:25.123Z")


def test_a_library_message_is_a_message_and_a_traceback_is_kept() -> None:
    entry = json.loads(JsonFormatter().format(_record("plain text from a library", exc=True)))
    assert entry["message"] == "plain text from a library" and "event" not in entry
    assert "RuntimeError: boom" in entry["exc"]


def test_fields_that_json_cannot_encode_are_written_as_text() -> None:
    entry = json.loads(JsonFormatter().format(_record("odd", {FIELDS: {"path": Path("/data/x")}})))
    assert entry["path"] == "/data/x"


def test_urls_in_fields_are_redacted() -> None:
    line = JsonFormatter().format(
        _record("hook", fields(url="https://user:pw@hooks.example.com/T0/secret?t=1"))
    )
    assert json.loads(line)["url"] == "https://hooks.example.com/…"


def test_configure_logging_installs_one_json_handler_and_quiets_noisy_libraries() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in NOISY_LOGGERS})
    try:
        root.handlers = [h for h in root.handlers if not isinstance(h.formatter, JsonFormatter)]
        configure_logging("INFO")
        configure_logging("INFO")  # a second call (a worker's child, a re-import) adds nothing
        assert sum(isinstance(h.formatter, JsonFormatter) for h in root.handlers) == 1
        assert root.level == logging.INFO
        assert all(logging.getLogger(n).level == logging.WARNING for n in NOISY_LOGGERS)
    finally:
        root.handlers, root.level = saved[0], saved[1]
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)
