"""The performance tables of README.md and docs/performance.md, generated from the committed
results in bench/results/, so a table cannot drift from the runs it quotes.

    python -m bench.report           # rewrite every table between its two marks
    python -m bench.report --check   # exit 1, naming the table, where a page differs from the results

Each figure stands beside the baseline measured in the same run, as a ratio (a run's ratio, never
numbers across runs: the machines are shared VMs whose speed drifts). The machine is what
bench.common's machine() stored in the result (CPU count, and a CPU label from `cpu` when the result
holds one, else the label below); the date is the result's `date` when it holds one, else the day
the result file was last committed (`git log`), "uncommitted" for a result not committed yet.
A page's table lies between `<!-- report:NAME:start ... -->` and `<!-- report:NAME:end -->`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

#: The results the pages cite, with the CPU each ran on (machine() records no CPU model; these
#: labels come from the session that ran each: /proc/cpuinfo's flags and vendor).
CPU_LABELS = {
    "machinery_amx7.json": "Intel AMX",
    "engine_reference_amx7.json": "Intel AMX",
    "worker_memory_zen4.json": "AMD Zen 4",
    "machinery_zen4_2.json": "AMD Zen 4",
    "machinery_zen4_3.json": "AMD Zen 4",
    "engine_reference_zen4_2.json": "AMD Zen 4",
    "webhook_drain.json": "x86_64",
    "tenants.json": "x86_64",
    "gateway.json": "x86_64",
    "chaos.json": "x86_64",
    "abuse.json": "x86_64",
}
#: The peak worker RSS target (0.6 GB) in MiB.
RSS_TARGET_MIB = 0.6e9 / 2**20
MODES = {"poll": "poll", "prefer": "`Prefer: wait`", "sse": "`sse`"}


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def runs_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A result file of several whole runs holds them as a list or a dict; one run is itself."""
    runs = report.get("runs")
    if "what" in report and isinstance(runs, dict):
        return list(runs.values())
    if "what" in report and isinstance(runs, list):
        return runs
    return [report]


@cache
def committed_date(name: str) -> str:
    path = RESULTS / name
    try:
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        date = subprocess.run(
            ["git", "log", "-1", "--format=%cs", "--", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown date"
    return "uncommitted" if dirty or not date else date


def machine_cell(name: str) -> str:
    report = load(name) or {}
    machine = runs_of(report)[0].get("machine", {})
    cpu = machine.get("cpu") or CPU_LABELS.get(name, "x86_64")
    date = machine.get("date") or report.get("date") or committed_date(name)
    return f"{machine.get('cpus', '?')} CPUs, {cpu}, {date}"


def num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"
    return f"{text}{unit}"


def spread(ratios: Sequence[float]) -> str:
    """The median ratio of the runs, and their range when there are several."""
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


@dataclass(frozen=True)
class Row:
    what: str
    genq: str
    baseline: str
    ratio: str
    source: str


def table(rows: Sequence[Row], prefix: str) -> str:
    """The rows as a Markdown table; each result file a reference link defined below it."""
    lines = [
        "| Measure | genq | Baseline, same run | Ratio | Machine, date | Result |",
        "|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        label = row.source.removesuffix(".json")
        cells = [row.what, row.genq, row.baseline, row.ratio, machine_cell(row.source), f"[{label}]"]
        lines.append(f"| {' | '.join(cells)} |")
    lines.append("")
    for source in dict.fromkeys(row.source for row in rows):
        lines.append(f"[{source.removesuffix('.json')}]: {prefix}bench/results/{source}")
    return "\n".join(lines)


def versus(what: str, genq: float, baseline: float, baseline_name: str, source: str, unit: str = "") -> Row:
    """One figure beside its baseline of the same run, and their ratio."""
    return Row(
        what, num(genq, unit), f"{baseline_name} {num(baseline, unit)}", f"{genq / baseline:.2f}", source
    )


# --- Rows ----------------------------------------------------------------------------------------


def machinery_rows(name: str, modes: Sequence[str], concurrency: Sequence[int]) -> list[Row]:
    """Jobs/s of the whole path (submit, run, answer) against bare Celery's no-op tasks/s, per mode
    and concurrency: medians of the runs, the ratio each run took."""
    report = load(name)
    if report is None:
        return []
    rows = []
    for mode in modes:
        for c in concurrency:
            points = [step for run in runs_of(report) for step in run["runs"] if step["concurrency"] == c]
            genq = [step[mode]["jobs_per_s"] for step in points]
            celery = [step["celery"]["tasks_per_s"] for step in points]
            ratios = [g / b for g, b in zip(genq, celery, strict=True)]
            rows.append(
                Row(
                    f"Jobs/s, {MODES[mode]}, C = {c}",
                    num(statistics.median(genq)),
                    f"Celery {num(statistics.median(celery))}",
                    spread(ratios),
                    name,
                )
            )
    return rows


def webhook_row(name: str) -> list[Row]:
    report = load(name)
    if report is None:
        return []
    hooks = [run["webhooks"] for run in runs_of(report)]
    genq = [hook["deliveries_per_s"] for hook in hooks]
    celery = [hook["celery_tasks_per_s"] for hook in hooks]
    ratios = [g / b for g, b in zip(genq, celery, strict=True)]
    jobs = hooks[0]["jobs"]
    return [
        Row(
            f"Webhooks delivered/s ({jobs:,} jobs)",
            num(statistics.median(genq)),
            f"Celery {num(statistics.median(celery))}",
            spread(ratios),
            name,
        )
    ]


def engine_rows(name: str, concurrency: Sequence[int]) -> list[Row]:
    """Generation tokens/s of genq's engine against llama-batched-bench on the same GGUF file (the
    median of the run's rounds)."""
    report = load(name)
    if report is None:
        return []
    rows = []
    for median in report["medians"]:
        if median["batch"] in concurrency:
            rows.append(
                Row(
                    f"Engine tokens/s, C = {median['batch']}",
                    num(median["genq"]["tg_tokens_per_s"]),
                    f"llama.cpp {num(median['llamacpp_defaults']['tg_tokens_per_s'])}",
                    f"{median['tg_tokens_per_s_vs_llamacpp_defaults']:.2f}",
                    name,
                )
            )
    return rows


def http_rows(name: str) -> list[Row]:
    """Tokens/s over HTTP (the OpenAI route, a real API and worker) against llama-server."""
    report = load(name)
    if report is None:
        return []
    return [
        Row(
            f"HTTP tokens/s, C = {median['clients']}",
            num(median["genq"]["tokens_per_s"]),
            f"llama-server {num(median['llama_server']['tokens_per_s'])}",
            f"{median['tokens_per_s_ratio']:.2f}",
            name,
        )
        for median in report["http"]["medians"]
    ]


def memory_row(name: str) -> list[Row]:
    report = load(name)
    if report is None:
        return []
    peak = report["peak_with_response_format_mib"]
    return [
        Row(
            "Worker peak RSS (MiB)",
            num(peak),
            f"bound {num(RSS_TARGET_MIB)} (0.6 GB)",
            f"{peak / RSS_TARGET_MIB:.2f}",
            name,
        )
    ]


def abuse_valid(report: dict[str, Any] | None) -> bool:
    """A full (not --quick) hostile-tenant run with its phases and verdicts."""
    return (
        report is not None
        and report.get("quick") is False
        and {"alone", "attack"} <= set(report.get("phases", {}))
        and isinstance(report.get("targets"), dict)
    )


def abuse_row(name: str = "abuse.json") -> list[Row]:
    report = load(name)
    if report is None or not abuse_valid(report):
        return []
    alone, attack = report["phases"]["alone"]["b"], report["phases"]["attack"]["b"]
    return [
        Row(
            "Hostile tenant: B's job p99, A attacking",
            num(attack["finish_p99_ms"], " ms"),
            f"B alone {num(alone['finish_p99_ms'], ' ms')}",
            f"{attack['finish_p99_ms'] / alone['finish_p99_ms']:.2f}",
            name,
        )
    ]


def readme_rows() -> list[Row]:
    return [
        *machinery_rows("machinery_zen4_3.json", ["poll"], [16, 64, 256]),
        *webhook_row("machinery_zen4_3.json"),
        *engine_rows("engine_reference_amx7.json", [1, 16]),
        *http_rows("engine_reference_amx7.json"),
        *memory_row("worker_memory_zen4.json"),
        *abuse_row(),
    ]


def machinery_table(prefix: str) -> str:
    rows = []
    for name in ("machinery_zen4_3.json", "machinery_zen4_2.json", "machinery_amx7.json"):
        rows += machinery_rows(name, list(MODES), [16, 64, 256]) + webhook_row(name)
    return table(rows, prefix)


def engine_table(prefix: str) -> str:
    rows = []
    for name in ("engine_reference_amx7.json", "engine_reference_zen4_2.json"):
        rows += engine_rows(name, [1, 4, 16, 32]) + http_rows(name)
    return table(rows, prefix)


def gateway_table(prefix: str, name: str = "gateway.json") -> str:
    """The API alone under wrk (64 connections, `genq api --workers 2`) against a bare FastAPI app."""
    report = load(name)
    if report is None:
        return ""
    config = next(config for config in report["configs"] if config["api_workers"] == 2)
    points = config["endpoints"]
    rows = [
        versus(label, points[key]["max"]["rate"], points[base]["max"]["rate"], "bare", name, "/s")
        for label, key, base in (
            ("Enqueues/s (`POST /v1/jobs`)", "enqueue", "bare_post"),
            ("Cache hits/s (`POST /v1/jobs`)", "cache_hit", "bare_post"),
            ("Reads/s (`GET /v1/jobs/{id}`)", "get_job", "bare_get"),
        )
    ]
    return table(rows, prefix)


def tenants_table(prefix: str, name: str = "tenants.json") -> str:
    report = load(name)
    if report is None:
        return ""
    quiet, busy = report["quiet"], report["busy"]
    held = f"A holds {report['streams']:,} streams + {report['long_polls']} long-polls"
    rows = [
        versus(f"B's GET p99, {held}", busy["get_p99_ms"], quiet["get_p99_ms"], "A idle", name, " ms"),
        versus(
            "B's job, submit → done p99", busy["finish_p99_ms"], quiet["finish_p99_ms"], "A idle", name, " ms"
        ),
        versus("API RSS", busy["rss_mb"], quiet["rss_mb"], "A idle", name, " MB"),
    ]
    return table(rows + abuse_row(), prefix)


def webhook_drain_table(prefix: str, name: str = "webhook_drain.json") -> str:
    report = load(name)
    if report is None:
        return ""
    one, many = report["medians"]["1"], report["medians"]["16"]
    what = f"Deliveries/s, 16 threads ({report['jobs']:,} queued)"
    rows = [versus(what, many["deliveries_per_s"], one["deliveries_per_s"], "1 thread", name)]
    return table(rows, prefix)


#: Every generated table: (page, table name, what renders it, given the page's path to the root).
TABLES: list[tuple[str, str, Callable[[str], str]]] = [
    ("README.md", "summary", lambda prefix: table(readme_rows(), prefix)),
    ("docs/performance.md", "machinery", machinery_table),
    ("docs/performance.md", "webhook_drain", webhook_drain_table),
    ("docs/performance.md", "engine", engine_table),
    ("docs/performance.md", "memory", lambda prefix: table(memory_row("worker_memory_zen4.json"), prefix)),
    ("docs/performance.md", "gateway", gateway_table),
    ("docs/performance.md", "tenants", tenants_table),
]


def marks(name: str) -> tuple[str, str]:
    return (
        f"<!-- report:{name}:start (generated by `python -m bench.report`) -->",
        f"<!-- report:{name}:end -->",
    )


def render(page: str, text: str) -> str:
    """The page's text with each of its tables replaced by the one the results give."""
    prefix = "../" * page.count("/")
    for table_page, name, make in TABLES:
        if table_page != page:
            continue
        start, end = marks(name)
        head, found, rest = text.partition(start)
        if not found:
            raise SystemExit(f"{page}: no {start}")
        _, found, tail = rest.partition(end)
        if not found:
            raise SystemExit(f"{page}: no {end}")
        text = f"{head}{start}\n{make(prefix)}\n{end}{tail}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    args = parser.parse_args(argv)
    stale = []
    for page in dict.fromkeys(page for page, _, _ in TABLES):
        path = ROOT / page
        text = path.read_text()
        new = render(page, text)
        if new != text:
            stale.append(page)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(
            f"stale performance tables in {', '.join(stale)}: run `python -m bench.report`", file=sys.stderr
        )
        return 1
    if not args.check:
        print(f"rewrote {', '.join(stale)}" if stale else "every table is current")
    if not abuse_valid(load("abuse.json")):
        print("bench/results/abuse.json missing or not a full run: its row is left out", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
