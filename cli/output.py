"""How the CLI shows jobs: JSON records for scripts, Rich tables and one-line summaries for people.

Output that is not a terminal gets JSON unless a command says otherwise, so a script piping
`genq ...` keeps a stable format whatever a person sees."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.client import Delta, Finished, StreamEvent

#: People read stdout; progress and summaries go to stderr so stdout holds only the answer.
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

STATUS_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "canceled": "yellow",
    "running": "cyan",
    "queued": "blue",
}


def wants_json(json_flag: bool) -> bool:
    """--json, or stdout is not a terminal (a pipe, a file: a script is reading)."""
    return json_flag or not sys.stdout.isatty()


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def print_ndjson(event: StreamEvent) -> None:
    """One stream event as a JSON line (`genq jobs stream --json`)."""
    match event:
        case Delta(text=text, tokens=tokens):
            line = {"event": "output", "delta": text, "tokens": tokens}
        case Finished(job=job):
            line = {"event": "done", "job": job}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def _seconds(ms: float | None) -> str:
    if ms is None:
        return "–"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def _tokens(job: dict[str, Any]) -> int | None:
    output = job.get("output") or {}
    usage = output.get("usage") or {}
    tokens = usage.get("completion_tokens")
    return int(tokens) if tokens is not None else None


def status_text(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def summary(job: dict[str, Any]) -> str:
    """One line: id, status, tokens, tokens/s, the prompt tokens the worker's prefix cache held (when
    any), queue and inference time (and the error, if any)."""
    metrics = job.get("metrics") or {}
    parts = [f"job {job['id']}", status_text(job["status"])]
    tokens, inference_ms = _tokens(job), metrics.get("inference_ms")
    if tokens is not None:
        parts.append(f"{tokens} tokens")
        if inference_ms:
            parts.append(f"{tokens / (inference_ms / 1000):.1f} tokens/s")
    reused = ((job.get("output") or {}).get("usage") or {}).get("cached_prompt_tokens")
    if reused:
        parts.append(f"{reused} prompt tokens reused")
    if job.get("cached"):
        parts.append("cached")
    parts += [f"queue {_seconds(metrics.get('queue_ms'))}", f"inference {_seconds(inference_ms)}"]
    error = job.get("error")
    if error:
        parts.append(f"[red]{escape(error['type'])}: {escape(error['message'])}[/]")
    return " · ".join(parts)


@contextmanager
def waiting(job_id: str) -> Iterator[Any]:
    """A spinner on stderr until the first token arrives (stop it with .stop())."""
    with err.status(f"job {job_id} queued…", spinner="dots") as status:
        yield status


def write_text(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def jobs_table(page: dict[str, Any]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("ID", "STATUS", "MODEL", "CREATED", "TOKENS", "QUEUE", "INFERENCE"):
        # Ids and times never wrap: people copy them.
        table.add_column(column, justify="right" if column in ("TOKENS", "QUEUE", "INFERENCE") else "left",
                         no_wrap=column in ("ID", "CREATED"))  # fmt: skip
    for job in page["data"]:
        metrics = job.get("metrics") or {}
        tokens = _tokens(job)
        table.add_row(
            job["id"], status_text(job["status"]), escape(job["model"]), _when(job.get("created_at")),
            "–" if tokens is None else str(tokens), _seconds(metrics.get("queue_ms")),
            _seconds(metrics.get("inference_ms")),
        )  # fmt: skip
    return table


def job_table(job: dict[str, Any]) -> Table:
    """One job as a two-column table, its output text last."""
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [("id", job["id"]), ("status", status_text(job["status"])), ("model", escape(job["model"]))]
    rows += [(name, _when(job.get(name))) for name in ("created_at", "started_at", "completed_at")]
    rows.append(("summary", summary(job)))
    output = job.get("output") or {}
    if "text" in output:
        rows.append(("output", escape(output["text"])))
    for name, value in rows:
        table.add_row(name, value)
    return table


def _when(timestamp: str | None) -> str:
    """RFC 3339 UTC shortened to the second: 2026-12-01 09:03:12."""
    return timestamp[:19].replace("T", " ") if timestamp else "–"
