"""The `genq` command: run the stack or one part of it, submit and follow jobs, probe a worker."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from cli.batches import batch_app
from cli.jobs import EXIT_CODES, jobs_app, submit
from shared.config import Settings, exposure_refusal
from shared.settings.types import is_loopback as _is_loopback

app = typer.Typer(help="genq: an LLM inference job service.", no_args_is_help=True, add_completion=False)
health_app = typer.Typer(help="Health probes (exit 0 healthy, 1 not).", no_args_is_help=True)
app.add_typer(health_app, name="health")
app.command(epilog=EXIT_CODES)(submit)
app.add_typer(jobs_app, name="jobs")
app.add_typer(batch_app, name="batch")


@app.command()
def up() -> None:
    """Run the whole local stack in the foreground (embedded Redis unless GENQ_REDIS_URL is set)."""
    from cli.stack import run_stack

    raise typer.Exit(run_stack(Settings()))


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="Bind address [GENQ_API_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Port [GENQ_API_PORT].")] = None,
    workers: Annotated[int | None, typer.Option(help="Processes [GENQ_API_WORKERS].")] = None,
) -> None:
    """Run the API tier."""
    import uvicorn

    from api.edge.uvicorn_adapter import http_protocol

    settings = Settings()
    settings.require_redis_url()
    host = host or settings.api_host
    refusal = exposure_refusal(settings, host)
    if refusal is not None:
        typer.echo(refusal, err=True)
        raise typer.Exit(2)
    workers = workers or settings.api_workers
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # Several processes: prometheus_client aggregates their instruments through files here.
        metrics_dir = settings.data_dir / "prometheus"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir.resolve())
    uvicorn.run(
        "api.app:create_app", factory=True, host=host, port=port or settings.api_port,
        workers=workers, access_log=False, log_config=None,
        timeout_graceful_shutdown=30, http=http_protocol(),
        limit_concurrency=settings.api_limit_concurrency, timeout_keep_alive=settings.api_keep_alive_s,
    )  # fmt: skip


@app.command()
def worker(
    queues: Annotated[
        str | None, typer.Option(help="Comma-separated queues; default genq.<GENQ_MODEL>.")
    ] = None,
    concurrency: Annotated[int | None, typer.Option(help="Task threads [GENQ_WORKER_CONCURRENCY].")] = None,
) -> None:
    """Run a worker: load the model, warm up, then consume its queue."""
    from workers.worker import run_worker

    run_worker(Settings(), queues.split(",") if queues else None, concurrency)


@app.command()
def flower(
    port: Annotated[int | None, typer.Option(help="Port [GENQ_FLOWER_PORT].")] = None,
    address: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
) -> None:
    """Run Flower (the Celery dashboard) against the broker, with basic auth off loopback."""
    from shared.celery_app import create_celery_app

    settings = Settings()
    auth = settings.flower_basic_auth.get_secret_value() if settings.flower_basic_auth else None
    if auth is None and not _is_loopback(address):
        typer.echo(f"refusing to run Flower on {address} without GENQ_FLOWER_BASIC_AUTH", err=True)
        raise typer.Exit(2)
    argv = ["flower", f"--port={port or settings.flower_port}", f"--address={address}"]
    if auth:
        argv.append(f"--basic-auth={auth}")
    create_celery_app(settings).start(argv)


@health_app.command("worker")
def health_worker() -> None:
    """Exit 0 when this host's worker is warmed up and its heartbeat is fresh."""
    settings = Settings()
    pidfile = settings.worker_pidfile or settings.data_dir / "worker.pid"
    ready = settings.worker_ready_file
    if ready is None and pidfile.exists():
        ready = settings.data_dir / f"worker-{pidfile.read_text().strip()}.ready"
    healthy = ready is not None and _fresh(ready, settings.heartbeat_ttl_s)
    typer.echo("ok" if healthy else "not ready")
    raise typer.Exit(0 if healthy else 1)


def _fresh(ready_file: Path, max_age_s: float) -> bool:
    """The worker's ready file exists and its heartbeat touched it within max_age_s (read here,
    not through workers/: a probe that runs every few seconds imports none of the worker)."""
    try:
        return time.time() - ready_file.stat().st_mtime < max_age_s
    except FileNotFoundError:
        return False


@app.command()
def drain(
    timeout: Annotated[float | None, typer.Option(help="Seconds [GENQ_DRAIN_TIMEOUT_S].")] = None,
) -> None:
    """Start the local worker's drain (SIGTERM via its pidfile) and wait for it to exit."""
    settings = Settings()
    pidfile = settings.worker_pidfile or settings.data_dir / "worker.pid"
    try:
        pid = int(Path(pidfile).read_text())
    except (FileNotFoundError, ValueError):
        typer.echo(f"no worker pidfile at {pidfile}", err=True)
        raise typer.Exit(0) from None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + (timeout or settings.drain_timeout_s) + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise typer.Exit(0) from None
        time.sleep(0.5)
    raise typer.Exit(1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(ctx: typer.Context, name: str) -> None:
    """Run a benchmark: `genq bench NAME [--quick]`, NAME one of gateway, end_to_end, machinery,
    engine, worker_memory, scale, cache, chaos, batch, abuse (bench/README)."""
    import runpy

    sys.argv = [f"bench.{name}", *ctx.args]
    runpy.run_module(f"bench.{name.replace('-', '_')}", run_name="__main__")


@app.command("settings")
def settings_table(
    doc: Annotated[
        Path | None,
        typer.Option(
            "--doc", "--readme", help="Rewrite this page's settings table (docs/settings.md) instead."
        ),
    ] = None,
) -> None:
    """Print every GENQ_* setting as a Markdown table (the one in docs/settings.md)."""
    from cli.settings_doc import markdown_table, update_doc

    if doc is None:
        typer.echo(markdown_table())
    else:
        doc.write_text(update_doc(doc.read_text()))


def _mount_optional() -> None:
    try:
        from cli.k8s import app as k8s_app
    except ImportError:
        return
    app.add_typer(k8s_app, name="k8s")


_mount_optional()


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()
