"""`genq submit` and `genq jobs ls|get|cancel|wait|stream`: the job API from a terminal.

At a terminal, `submit` and `stream` print the answer as it is generated, then one summary line
on stderr; everything else prints a table. With --json, or when stdout is not a terminal, the
commands print the job record (a page of them for `ls`), so scripts see one stable format. Exit
codes (cli.client.ExitCode): 0 succeeded, 1 failed, 2 usage error, 3 canceled, 4 timed out
waiting, 5 the API refused the request or could not be reached; 130 on Ctrl-C.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.markup import escape

from cli import output
from cli.client import TERMINAL, ApiError, Delta, ExitCode, Finished, JobsClient, exit_code_for
from shared.config import Settings
from shared.schemas import JobStatus

EXIT_CODES = "Exit codes: 0 succeeded, 1 failed, 2 usage error, 3 canceled, 4 timed out, 5 API error."
jobs_app = typer.Typer(
    help="List, inspect, cancel, wait on and stream jobs.", epilog=EXIT_CODES, no_args_is_help=True
)

#: API errors that mean the request itself was wrong (a usage error), not the service.
USAGE_STATUSES = frozenset({400, 413, 422})


ApiKeyOption = Annotated[
    str | None, typer.Option("--api-key", help="API key [GENQ_API_KEY].", show_default=False)
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the JSON record (the default when stdout is not a terminal).")
]
TimeoutOption = Annotated[float, typer.Option(help="Seconds to wait for the job to end (then exit 4).")]
JobIdArgument = Annotated[str, typer.Argument(help="The job's id.", show_default=False)]


@contextmanager
def connect(api_key: str | None) -> Iterator[JobsClient]:
    """A client for GENQ_API_URL with --api-key or GENQ_API_KEY; API errors and Ctrl-C become
    the documented exit codes."""
    settings = Settings()
    key = api_key or (settings.api_key.get_secret_value() if settings.api_key else None)
    try:
        with JobsClient(settings.api_url, key) as client:
            yield client
    except ApiError as exc:
        output.err.print(f"[red]error[/]: {escape(exc.type)}: {escape(exc.message)}")
        raise typer.Exit(ExitCode.USAGE if exc.status in USAGE_STATUSES else ExitCode.API_ERROR) from None
    except KeyboardInterrupt:
        output.err.print("\ninterrupted; the job goes on (genq jobs cancel ID stops it)")
        raise typer.Exit(130) from None


def submit(
    prompt: Annotated[
        str | None, typer.Argument(help="The prompt; read from stdin when omitted.", show_default=False)
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model id (default: the API's).")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Most tokens to generate.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature, 0-2.")] = None,
    wait: Annotated[
        bool | None,
        typer.Option(
            "--wait/--no-wait", help="Wait for the end (default: yes at a terminal, no with --json or piped)."
        ),
    ] = None,
    json_flag: JsonOption = False,
    timeout: TimeoutOption = 300.0,
    api_key: ApiKeyOption = None,
) -> None:
    """Submit a prompt. At a terminal, print the answer as it is generated and a summary line;
    with --json (or piped), print the job record (the finished one with --wait)."""
    body = _job_body(prompt, model, max_tokens, temperature)
    as_json = output.wants_json(json_flag)
    with connect(api_key) as client:
        job = client.submit(body)
        if as_json:
            if wait:
                job = _wait(client, job, timeout)
            output.print_json(job)
            raise typer.Exit(exit_code_for(job) if wait else ExitCode.OK)
        if wait is False:
            output.err.print(
                f"job {job['id']} {output.status_text(job['status'])}: genq jobs stream {job['id']}"
            )
            output.write_text(job["id"] + "\n")
            raise typer.Exit(ExitCode.OK)
        raise typer.Exit(exit_code_for(_stream_text(client, job["id"], timeout)))


def _job_body(
    prompt: str | None, model: str | None, max_tokens: int | None, temperature: float | None
) -> dict[str, Any]:
    if prompt is None:
        if sys.stdin.isatty():
            raise typer.BadParameter("give a prompt, or pipe one on stdin", param_hint="PROMPT")
        prompt = sys.stdin.read()
    body: dict[str, Any] = {"prompt": prompt, "model": model, "max_tokens": max_tokens,
                            "temperature": temperature}  # fmt: skip
    return {name: value for name, value in body.items() if value is not None}


def _wait(client: JobsClient, job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The job once it has ended, or as it is when timeout_s has passed."""
    if job["status"] in TERMINAL:
        return job
    for event in client.follow(job["id"], timeout_s):
        if isinstance(event, Finished):
            return event.job
    raise AssertionError("follow() always ends with Finished")  # pragma: no cover


def _stream_text(client: JobsClient, job_id: str, timeout_s: float) -> dict[str, Any]:
    """Print the job's text as it arrives (a spinner on stderr until the first token), then the
    summary line on stderr; returns the final job."""
    wrote = ""
    with output.waiting(job_id) as spinner:
        for event in client.follow(job_id, timeout_s):
            if isinstance(event, Delta):
                spinner.stop()
                output.write_text(event.text)
                wrote += event.text
            elif isinstance(event, Finished):
                spinner.stop()
                if wrote and not wrote.endswith("\n"):
                    output.write_text("\n")
                output.err.print(output.summary(event.job))
                return event.job
    raise AssertionError("follow() always ends with Finished")  # pragma: no cover


def show(
    record: dict[str, Any], json_flag: bool, for_people: Callable[[dict[str, Any]], RenderableType]
) -> None:
    """The record as JSON for scripts, or rendered for a person at a terminal."""
    if output.wants_json(json_flag):
        output.print_json(record)
    else:
        output.out.print(for_people(record))


@jobs_app.command("ls")
def list_jobs(
    status: Annotated[JobStatus | None, typer.Option(help="Only jobs with this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100, help="Most jobs to list, newest first.")] = 20,
    cursor: Annotated[str | None, typer.Option(help="Continue after a previous page.")] = None,
    json_flag: JsonOption = False,
    api_key: ApiKeyOption = None,
) -> None:
    """List your jobs, newest first."""
    with connect(api_key) as client:
        page = client.list(status.value if status else None, limit, cursor)
    show(page, json_flag, output.jobs_table)
    if page.get("next_cursor") and not output.wants_json(json_flag):
        same = f" --status {status.value}" if status else ""
        output.err.print(f"more: genq jobs ls --cursor {page['next_cursor']}{same} --limit {limit}")


@jobs_app.command("get")
def get_job(job_id: JobIdArgument, json_flag: JsonOption = False, api_key: ApiKeyOption = None) -> None:
    """Show a job as it is now."""
    with connect(api_key) as client:
        show(client.get(job_id), json_flag, output.job_table)


@jobs_app.command("cancel")
def cancel_job(job_id: JobIdArgument, json_flag: JsonOption = False, api_key: ApiKeyOption = None) -> None:
    """Cancel a job: a queued one never starts, a running one stops; an ended one is unchanged."""
    with connect(api_key) as client:
        show(
            client.cancel(job_id),
            json_flag,
            lambda job: f"job {job['id']} {output.status_text(job['status'])}",
        )


@jobs_app.command("wait")
def wait_job(
    job_id: JobIdArgument,
    timeout: TimeoutOption = 300.0,
    json_flag: JsonOption = False,
    api_key: ApiKeyOption = None,
) -> None:
    """Wait for a job to end; the exit code says how it ended."""
    with connect(api_key) as client:
        job = _wait(client, client.get(job_id), timeout)
    if output.wants_json(json_flag):
        output.print_json(job)
    else:
        output.err.print(output.summary(job))
    raise typer.Exit(exit_code_for(job))


@jobs_app.command("stream")
def stream_job(
    job_id: JobIdArgument,
    timeout: TimeoutOption = 300.0,
    json_flag: Annotated[
        bool, typer.Option("--json", help="Print each event as a JSON line (output deltas, then done).")
    ] = False,
    api_key: ApiKeyOption = None,
) -> None:
    """Print a job's output as it is generated (from the start, even if it already ended)."""
    with connect(api_key) as client:
        if not json_flag:
            raise typer.Exit(exit_code_for(_stream_text(client, job_id, timeout)))
        for event in client.follow(job_id, timeout):
            output.print_ndjson(event)
            if isinstance(event, Finished):
                raise typer.Exit(exit_code_for(event.job))
