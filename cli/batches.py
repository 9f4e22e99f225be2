"""`genq batch submit FILE.jsonl [--wait]`, `genq batch get ID`, `genq batch cancel ID`: the Batch
API from a terminal. `submit` uploads the file and creates the batch; with --wait it shows a
progress bar (on stderr, at a terminal) until the batch ends, and with --output it saves the
output file (and the error file beside it, `.errors.jsonl`). Piped or with --json, the commands
print the batch object. Exit codes: 0 completed, 1 failed, 3 cancelled, 4 expired or timed out
waiting, 2 usage error, 5 API error."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli import output
from cli.client import ExitCode, JobsClient
from cli.jobs import ApiKeyOption, JsonOption, connect

batch_app = typer.Typer(help="Submit, inspect and cancel batches (OpenAI's Batch API).", no_args_is_help=True)

#: Statuses after which a batch never changes, with the exit code each means.
ENDED = {"completed": ExitCode.OK, "failed": ExitCode.FAILED, "cancelled": ExitCode.CANCELED,
         "expired": ExitCode.TIMED_OUT}  # fmt: skip
POLL_S = 1.0


@batch_app.command("submit")
def submit_batch(
    path: Annotated[Path, typer.Argument(help="The JSONL file of requests.", exists=True, dir_okay=False)],
    endpoint: Annotated[str, typer.Option(help="What each line calls.")] = "/v1/chat/completions",
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the batch to end, with a progress bar.")
    ] = False,
    save: Annotated[
        Path | None, typer.Option("--output", help="With --wait: save the output file here.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait (then exit 4).")] = 86_400.0,
    json_flag: JsonOption = False,
    api_key: ApiKeyOption = None,
) -> None:
    """Upload FILE and create a batch from it; with --wait, follow it to its end."""
    with connect(api_key) as client:
        uploaded = client.upload(path)
        batch = client.create_batch(uploaded["id"], endpoint)
        if wait:
            batch = _follow(client, batch, timeout, show_bar=not output.wants_json(json_flag))
            if save is not None:
                _save(client, batch, save)
        _show(batch, json_flag)
        raise typer.Exit(ENDED.get(batch["status"], ExitCode.TIMED_OUT) if wait else ExitCode.OK)


@batch_app.command("get")
def get_batch(batch_id: str, json_flag: JsonOption = False, api_key: ApiKeyOption = None) -> None:
    """One batch: status and request counts."""
    with connect(api_key) as client:
        _show(client.get_batch(batch_id), json_flag)


@batch_app.command("cancel")
def cancel_batch(batch_id: str, json_flag: JsonOption = False, api_key: ApiKeyOption = None) -> None:
    """Cancel a batch (its finished lines are kept in its output file)."""
    with connect(api_key) as client:
        _show(client.cancel_batch(batch_id), json_flag)


def _follow(client: JobsClient, batch: dict[str, Any], timeout_s: float, show_bar: bool) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=output.err, disable=not show_bar or not output.err.is_terminal) as bar:
        task = bar.add_task(batch["status"], total=None)
        while batch["status"] not in ENDED and time.monotonic() < deadline:
            time.sleep(POLL_S)
            batch = client.get_batch(batch["id"])
            counts = batch["request_counts"]
            bar.update(task, description=batch["status"], total=counts["total"] or None,
                       completed=counts["completed"] + counts["failed"])  # fmt: skip
    return batch


def _save(client: JobsClient, batch: dict[str, Any], path: Path) -> None:
    if batch.get("output_file_id"):
        client.download(batch["output_file_id"], path)
    if batch.get("error_file_id"):
        client.download(batch["error_file_id"], path.with_suffix(".errors.jsonl"))


def _show(batch: dict[str, Any], json_flag: bool) -> None:
    if output.wants_json(json_flag):
        output.print_json(batch)
        return
    counts = batch["request_counts"]
    done = f"{counts['completed']} completed, {counts['failed']} failed of {counts['total']}"
    output.out.print(f"batch {batch['id']} · {batch['status']} · {done}")
    for name in ("output_file_id", "error_file_id"):
        if batch.get(name):
            output.out.print(f"  {name}: {batch[name]}")
