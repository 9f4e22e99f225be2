"""Finding llama.cpp's reference tools (bench/llamacpp_reference.py) without building them: a build
takes minutes, so these tests never start one."""

from __future__ import annotations

import importlib.metadata
import stat
from pathlib import Path

import pytest

from bench.llamacpp_reference import (
    ENV_VAR,
    TOOLS,
    ReferenceError,
    locate,
    tools_in,
    vendored_commit,
)


def make_tools(folder: Path, script: str = "#!/bin/sh\n") -> None:
    """Two executable files named as the tools, where a CMake build puts them."""
    (folder / "bin").mkdir(parents=True)
    for tool in TOOLS:
        path = folder / "bin" / tool
        path.write_text(script)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_without_tools_the_smoke_mode_says_so_and_builds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    said: list[str] = []
    assert locate(build=False, say=said.append, cache=tmp_path) is None
    version = importlib.metadata.version("llama-cpp-python")
    assert said == [
        f"llama.cpp reference tools not found in {tmp_path / version / 'build'} "
        "(python -m bench.llamacpp_reference builds them)"
    ]
    assert list(tmp_path.iterdir()) == []  # no download, no folder


def cached_build(
    cache: Path, monkeypatch: pytest.MonkeyPatch, script: str = "#!/bin/sh\n"
) -> tuple[str, Path]:
    """Tools where `locate` looks for the installed version's cached build; its version and folder."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    version = importlib.metadata.version("llama-cpp-python")
    build = cache / version / "build"
    make_tools(build, script)
    return version, build


def test_a_cached_build_is_found_by_the_installed_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version, build = cached_build(tmp_path, monkeypatch)
    # Tools without the record a finished build writes are an interrupted build: not used.
    assert locate(build=False, say=lambda _: None, cache=tmp_path) is None
    (build / "reference.json").write_text(f'{{"version": "{version}", "commit": "{"a" * 40}"}}')
    said: list[str] = []
    reference = locate(build=False, say=said.append, cache=tmp_path)
    assert reference is not None
    assert (reference.origin, reference.version, reference.commit) == ("found", version, "a" * 40)
    assert reference.batched_bench == build / "bin" / "llama-batched-bench"
    assert reference.server == build / "bin" / "llama-server"
    assert said == [f"found llama.cpp {version} reference tools in {build}"]


def test_a_cached_build_that_cannot_run_is_skipped_by_the_smoke_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a build copied from another machine looks like: there, but its libraries are missing.
    missing = "libllama.so: cannot open shared object file: No such file or directory"
    version, build = cached_build(tmp_path, monkeypatch, f"#!/bin/sh\necho '{missing}' >&2\nexit 127\n")
    (build / "reference.json").write_text(f'{{"version": "{version}"}}')
    said: list[str] = []
    assert locate(build=False, say=said.append, cache=tmp_path) is None
    assert said == [
        f"found llama.cpp {version} reference tools in {build} but they cannot run "
        f"(llama-batched-bench --version exited 127: {missing}): "
        "python -m bench.llamacpp_reference rebuilds them"
    ]
    assert (build / "bin" / "llama-server").exists()  # the smoke mode leaves the folder alone


def test_a_given_folder_wins_and_must_hold_both_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(ReferenceError, match="holds no bin/llama-batched-bench and bin/llama-server"):
        locate(tmp_path, say=lambda _: None, cache=tmp_path / "cache")
    make_tools(tmp_path / "mine")
    reference = locate(tmp_path / "mine", say=lambda _: None, cache=tmp_path / "cache")
    assert reference is not None and reference.origin == "given"
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "mine"))  # the variable does what the flag does
    reference = locate(build=False, say=lambda _: None, cache=tmp_path / "cache")
    assert reference is not None and reference.origin == "given"
    assert not (tmp_path / "cache").exists()


def test_tools_in_a_folder_need_both_and_executable(tmp_path: Path) -> None:
    make_tools(tmp_path)
    assert tools_in(tmp_path) == (tmp_path / "bin" / TOOLS[0], tmp_path / "bin" / TOOLS[1])
    (tmp_path / "bin" / TOOLS[1]).chmod(0o644)
    assert tools_in(tmp_path) is None


def test_the_vendored_commit_is_the_submodule_head_the_sdist_keeps(tmp_path: Path) -> None:
    head = tmp_path / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
    assert vendored_commit(tmp_path) is None
    head.parent.mkdir(parents=True)
    head.write_text("0c1e57098bba43ac29e6e3b677cdceebdd22334f\n")
    assert vendored_commit(tmp_path) == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    head.write_text("ref: refs/heads/master\n")  # a branch, not a commit: unknown
    assert vendored_commit(tmp_path) is None
