"""cli/output.py: what people and scripts see of a job. Scripts get stable JSON (and JSON lines
for a stream) whenever stdout is not a terminal; people get one summary line with tokens, speed
and times, and tables whose text from the job cannot inject Rich markup."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console

from cli import output
from cli.client import Delta, Finished

JOB: dict[str, Any] = {
    "id": "0b6c", "status": "succeeded", "model": "placeholder-echo", "cached": False,
    "created_at": "2026-12-01T09:03:12.345678Z", "started_at": "2026-12-01T09:03:12.5Z", "completed_at": None,
    "output": {"text": "hello [bold]world[/bold]", "usage": {"completion_tokens": 40}},
    "metrics": {"queue_ms": 12.4, "inference_ms": 2000.0}, "error": None,
}  # fmt: skip


def _plain(renderable: Any) -> str:
    console = Console(width=200, record=True, highlight=False)
    console.print(renderable)
    return console.export_text()


def test_json_whenever_stdout_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert output.wants_json(json_flag=False)  # pytest's stdout is captured, not a terminal
    assert output.wants_json(json_flag=True)
    output.print_json({"id": "j1"})
    assert json.loads(capsys.readouterr().out) == {"id": "j1"}


def test_stream_events_as_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    output.print_ndjson(Delta("Hel", 1))
    output.print_ndjson(Finished({"id": "j1", "status": "succeeded"}))
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        {"event": "output", "delta": "Hel", "tokens": 1},
        {"event": "done", "job": {"id": "j1", "status": "succeeded"}},
    ]


def test_the_summary_line() -> None:
    line = _plain(output.summary(JOB)).strip()
    assert line == "job 0b6c · succeeded · 40 tokens · 20.0 tokens/s · queue 12 ms · inference 2.00 s"
    cached = _plain(output.summary(JOB | {"cached": True, "metrics": {}})).strip()
    assert cached == "job 0b6c · succeeded · 40 tokens · cached · queue – · inference –"
    usage = {"completion_tokens": 40, "prompt_tokens": 30, "cached_prompt_tokens": 24}
    reused = _plain(output.summary(JOB | {"output": {"text": "", "usage": usage}})).strip()
    expected = "job 0b6c · succeeded · 40 tokens · 20.0 tokens/s · 24 prompt tokens reused · queue 12 ms"
    assert reused == expected + " · inference 2.00 s"


def test_an_error_is_shown_as_typed_and_never_read_as_markup() -> None:
    failed = JOB | {
        "status": "failed",
        "output": None,
        "error": {"type": "timeout", "message": "past [red]x[/red]"},
    }
    assert _plain(output.summary(failed)).strip().endswith("timeout: past [red]x[/red]")


def test_the_job_table_shows_times_to_the_second_and_the_text_verbatim() -> None:
    text = _plain(output.job_table(JOB))
    assert "2026-12-01 09:03:12" in text and "09:03:12.3" not in text
    assert "hello [bold]world[/bold]" in text
    assert "completed_at  –" in text


def test_the_jobs_table_has_a_row_per_job() -> None:
    queued: dict[str, Any] = {
        "id": "1f2e",
        "status": "queued",
        "model": "m",
        "created_at": None,
        "output": None,
        "metrics": {},
    }
    rows = _plain(output.jobs_table({"data": [JOB, queued]})).splitlines()
    assert rows[0].split() == ["ID", "STATUS", "MODEL", "CREATED", "TOKENS", "QUEUE", "INFERENCE"]
    assert rows[1].split()[:3] == ["0b6c", "succeeded", "placeholder-echo"] and "40" in rows[1]
    assert rows[2].split() == ["1f2e", "queued", "m", "–", "–", "–", "–"]
