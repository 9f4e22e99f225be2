"""bench.abuse's verdicts, tables and plot: each target of the hostile-tenant run with its measured
value and pass/fail, key B's latency per phase, every attack's answers, and the resources' peaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import print_table, ratio

P99_RATIO_TARGET = 1.5
HEALTHZ_TARGET_MS = 100.0
PHASES = ("alone", "attack", "full_redis")


def _target(value: Any, target: str, passed: bool) -> dict[str, Any]:
    return {"value": value, "target": target, "pass": bool(passed)}


def targets(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each of the issue's targets: the value measured, the bound, and whether it held."""
    phases = report["phases"]
    alone, attack = phases["alone"], phases["attack"]
    found: dict[str, dict[str, Any]] = {}
    for what in ("submit", "finish"):
        value = ratio(attack["b"][f"{what}_p99_ms"], alone["b"][f"{what}_p99_ms"])
        found[f"b_{what}_p99_attack_over_alone"] = _target(
            value, f"<= {P99_RATIO_TARGET}", value is not None and value <= P99_RATIO_TARGET
        )
    for stat in ("p99", "max"):
        value = attack["healthz"][f"healthz_{stat}_ms"]
        found[f"healthz_{stat}_ms_under_attack"] = _target(
            value, f"< {HEALTHZ_TARGET_MS:.0f}", value is not None and value < HEALTHZ_TARGET_MS
        )
    worst = max(phases[name]["healthz"]["healthz_max_ms"] or 0.0 for name in PHASES)
    found["healthz_max_ms_throughout"] = _target(
        worst, f"< {HEALTHZ_TARGET_MS:.0f}", worst < HEALTHZ_TARGET_MS
    )
    not_ok = sum(phases[name]["healthz"]["not_ok"] for name in PHASES)
    found["healthz_not_200"] = _target(not_ok, "0", not_ok == 0)
    accepted = sum(phases[name]["b"]["accepted"] for name in PHASES)
    succeeded = sum(phases[name]["b"]["succeeded"] for name in PHASES)
    found["b_accepted_jobs_succeeded"] = _target(f"{succeeded}/{accepted}", "all", succeeded == accepted)
    for name, state in report["processes"].items():
        found[f"{name}_alive_same_pids"] = _target(state["same_pids"], "True", state["same_pids"])
    first_503 = phases["full_redis"]["a"]["first_503_s"]
    found["full_redis_answered_503"] = _target(
        first_503, "a 503 before the fill's limit", first_503 is not None
    )
    return found


def print_tables(report: dict[str, Any]) -> None:
    rows = [
        [name, t["value"], t["target"], "pass" if t["pass"] else "FAIL"]
        for name, t in report["targets"].items()
    ]
    print_table("Hostile tenant: targets", ["target", "measured", "bound", ""], rows)
    columns = ["phase", "settle s", "B sent", "accepted", "succeeded", "B codes"]
    measures = ["submit_p50_ms", "submit_p99_ms", "finish_p50_ms", "finish_p99_ms"]
    columns += [m.removesuffix("_ms").replace("_", " ") for m in measures] + ["/healthz p99", "/healthz max"]
    rows = []
    for name in PHASES:
        result = report["phases"][name]
        b, probe = result["b"], result["healthz"]
        counts = [b["submitted"], b["accepted"], b["succeeded"], _codes(b["codes"])]
        latencies = [b[m] for m in measures] + [probe["healthz_p99_ms"], probe["healthz_max_ms"]]
        rows.append([name, result["settled_after_s"], *counts, *latencies])
    print_table("Key B per phase (ms)", columns, rows)
    attacks = {**report["phases"]["attack"]["a"], **report["phases"]["full_redis"]["a"]["attacks"]}
    rows = [
        [name, a["requests"], _codes(a["codes"]), a.get("p50_ms"), a.get("max_ms")]
        for name, a in attacks.items()
    ]
    print_table("Key A's attacks: answers (ms)", ["attack", "requests", "status codes", "p50", "max"], rows)
    peaks = {"whole run": report["resources"], **{name: report["phases"][name]["peaks"] for name in PHASES}}
    columns = ["", "API RSS MB", "worker RSS MB", "API temp MB", "file storage MB", "Redis used MB"]
    print_table("Peaks (sampled every 100 ms)", columns, [[name, *p.values()] for name, p in peaks.items()])
    rows = [[name, *report["phases"][name]["cpu"].values()] for name in PHASES]
    print_table(
        "CPU, % of one core (2 cores here: the host's limit is 200)", ["", "API", "worker", "Redis"], rows
    )


def _codes(codes: dict[str, int]) -> str:
    return " ".join(f"{code}x{count}" for code, count in sorted(codes.items()))


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for name, color in zip(PHASES, ("tab:green", "tab:red", "tab:purple"), strict=True):
        start, end = report["phases"][name]["window_s"]
        for axis in (top, bottom):
            axis.axvspan(start, end, color=color, alpha=0.08)
        slowest = report["phases"][name]["healthz"]["slowest_per_s"]
        top.plot(
            [s[0] for s in slowest], [s[1] for s in slowest], ".", color=color, label=f"/healthz, {name}"
        )
        jobs = report["phases"][name]["b"]["finish_timeline"]
        top.plot([j[0] for j in jobs], [j[1] for j in jobs], "x", color=color, markersize=3, alpha=0.5)
    top.axhline(HEALTHZ_TARGET_MS, color="black", linestyle="--", linewidth=0.8, label="100 ms")
    top.set_yscale("log")
    top.set_ylabel("ms: /healthz slowest per s (.),\nB submit -> finished (x)")
    top.legend(loc="upper left", fontsize=8)
    samples = report["samples"]
    times = [s[0] for s in samples]
    for index, label in enumerate(
        ["API RSS", "worker RSS", "API temp", "file storage", "Redis used"], start=1
    ):
        bottom.plot(times, [s[index] for s in samples], label=label)
    bottom.set_ylabel("MB")
    bottom.set_xlabel("s")
    bottom.legend(loc="upper left", fontsize=8)
    ratios = report["targets"]
    top.set_title(
        f"Key A attacks, key B: finish p99 x{ratios['b_finish_p99_attack_over_alone']['value']}, "
        f"submit p99 x{ratios['b_submit_p99_attack_over_alone']['value']} of alone"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
