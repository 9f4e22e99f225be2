"""Shared helpers of the deployment checks: where the repo and the CLI tools are, YAML loading."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    """Path of a CLI tool from the dev extras (the venv's bin first), or skip saying what's missing."""
    beside_python = Path(sys.executable).parent / name
    found = str(beside_python) if beside_python.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (it comes with the dev extras: pip install -e '.[dev]')")
    return found


def run(*args: str) -> str:
    """Run a tool; fail the test with its output if it fails."""
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def load_all(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def load(path: str | Path) -> Any:
    return yaml.safe_load((ROOT / path).read_text())
