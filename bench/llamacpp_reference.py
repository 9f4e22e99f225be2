"""llama.cpp's own tools as the reference genq's CPU engine is measured against: `llama-batched-bench`
(engine level) and `llama-server` (end to end over HTTP), built from the llama.cpp sources vendored
in the llama-cpp-python release genq runs, so both sides run the same kernels.

    python -m bench.llamacpp_reference                 # find them, or build them once (~8 min, 2 cores)
    python -m bench.llamacpp_reference --build-dir DIR # use a llama.cpp build folder of your own

Found, in this order: --build-dir (or $LLAMACPP_REFERENCE_DIR), a CMake build folder holding
bin/llama-batched-bench and bin/llama-server; else the cache .genq/llama.cpp/<version>/build of the
installed llama-cpp-python version; else (unless told not to) built there: `pip download` of that
version's sdist (the only network access, through pip), its vendor/llama.cpp configured with
REFERENCE_CMAKE_ARGS and just the two targets built. GGML_NATIVE keeps its default (on), as in the
binding's own build (Makefile's LLAMA_CMAKE_ARGS leave it alone too), so both use the CPU features
of this machine; release build, shared libraries, as the binding. The build folder's reference.json
records the version, the vendored llama.cpp commit (the sdist carries the submodule's git metadata),
the CMake arguments and how long the build took.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where built references are cached, one folder per llama-cpp-python version (git-ignored).
CACHE = ROOT / ".genq" / "llama.cpp"
#: Points at an existing llama.cpp build folder (as --build-dir does).
ENV_VAR = "LLAMACPP_REFERENCE_DIR"
PACKAGE = "llama-cpp-python"
TOOLS = ("llama-batched-bench", "llama-server")
#: The tools and what they need, nothing else (no tests, examples, web UI download or TLS): the
#: server is built without its web UI, which the build would otherwise fetch from the network.
REFERENCE_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
#: CPU-minutes the build takes (measured: 7.6 minutes with 2 jobs on the 2-core VM, pip download
#: included, llama-cpp-python 0.3.36, gcc 12): the estimate printed before a build.
BUILD_CPU_MINUTES = 15
#: What a reference folder records about itself.
RECORD = "reference.json"
BUILD_COMMAND = "python -m bench.llamacpp_reference"


@dataclass(frozen=True)
class Reference:
    """The two tools of one llama.cpp build, and where they came from."""

    batched_bench: Path
    server: Path
    build_dir: Path
    #: "given" (--build-dir / $LLAMACPP_REFERENCE_DIR), "found" (the cache) or "built" (just now).
    origin: str
    #: llama-cpp-python's version the build comes from (None for a given folder without a record).
    version: str | None = None
    #: The vendored llama.cpp commit, when known.
    commit: str | None = None

    def describe(self) -> dict[str, str | None]:
        return {key: str(value) if isinstance(value, Path) else value for key, value in asdict(self).items()}


#: What a run of llama.cpp's defaults that was killed by a signal is replaced with, and says:
#: the same with -nr. Its repacked weight kernels were seen to crash (SIGSEGV, SIGILL) on a 2-core
#: VM whose CPU reports AMX; genq's engine never repacks (workers/engine/llamacpp/model.py).
REPACK_CRASHED = (
    "llama.cpp's defaults were killed by a signal ({code}) on this CPU (its repacked weight kernels), "
    "so this side runs them with -nr, the plain weight kernels genq's engine uses"
)


class ReferenceError(RuntimeError):
    """A reference that cannot be found or built; the message says what to do."""


def binding_version() -> str:
    """The installed llama-cpp-python's version (the worker extra installs it)."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ReferenceError(f"{PACKAGE} is not installed (pip install -e '.[worker]')") from exc


def tools_in(build_dir: Path) -> tuple[Path, Path] | None:
    """The two tools in a build folder (its bin/, or the folder itself), or None."""
    for folder in (build_dir / "bin", build_dir):
        found = [folder / tool for tool in TOOLS]
        if all(path.is_file() and os.access(path, os.X_OK) for path in found):
            return found[0], found[1]
    return None


def locate(
    build_dir: Path | None = None,
    build: bool = True,
    say: Callable[[str], None] = print,
    cache: Path = CACHE,
) -> Reference | None:
    """The reference tools (see the module docstring); None when they are not found and `build` is
    False. Says which it uses, or that it builds them. ReferenceError when a given folder lacks them
    or the build fails."""
    given = build_dir or (Path(os.environ[ENV_VAR]) if os.environ.get(ENV_VAR) else None)
    if given is not None:
        return _given(given.resolve(), say)
    version = binding_version()
    folder = cache / version
    reference = _cached(folder, version)
    broken = _why_not_runnable(reference) if reference is not None else ""
    if broken:
        # A build carried over from another machine (or with a library gone) is as good as none.
        say(f"found llama.cpp {version} reference tools in {folder / 'build'} but they cannot run "
            f"({broken}): {'rebuilding them' if build else f'{BUILD_COMMAND} rebuilds them'}")  # fmt: skip
        reference = None
    if reference is None and not build:
        if not broken:
            say(f"llama.cpp reference tools not found in {folder / 'build'} ({BUILD_COMMAND} builds them)")
        return None
    if reference is None:
        with _locked(folder):  # another run may be building them: wait for it, then look again
            reference = _cached(folder, version)
            if reference is None or _why_not_runnable(reference):
                return build_reference(version, folder, say)
    say(f"found llama.cpp {version} reference tools in {reference.build_dir}")
    return reference


def _given(build_dir: Path, say: Callable[[str], None]) -> Reference:
    tools = tools_in(build_dir)
    if tools is None:
        raise ReferenceError(f"{build_dir} holds no bin/{TOOLS[0]} and bin/{TOOLS[1]}")
    record = _read_record(build_dir)
    say(f"using the llama.cpp tools in {build_dir} (given)")
    return Reference(*tools, build_dir, "given", record.get("version"), record.get("commit"))


def _cached(folder: Path, version: str) -> Reference | None:
    build_dir = folder / "build"
    record = _read_record(build_dir)
    tools = tools_in(build_dir)
    if tools is None or record.get("version") != version:  # no record: an interrupted build
        return None
    return Reference(*tools, build_dir, "found", version, record.get("commit"))


def _why_not_runnable(reference: Reference) -> str:
    """Why the tools fail to start (`--version` of each), or "" when both run."""
    for tool in (reference.batched_bench, reference.server):
        try:
            done = subprocess.run([str(tool), "--version"], capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{tool.name} --version: {exc}"
        if done.returncode != 0:
            last = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-1:]
            return f"{tool.name} --version exited {done.returncode}{': ' + last[0] if last else ''}"
    return ""


def _read_record(build_dir: Path) -> dict[str, str]:
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads((build_dir / RECORD).read_text()))
    return {}


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One build per folder at a time: a second run waits for the first, then finds its tools."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_reference(version: str, folder: Path, say: Callable[[str], None] = print) -> Reference:
    """Download `version`'s sdist into `folder`, unpack it, build the two tools in folder/build."""
    jobs = os.cpu_count() or 1
    say(f"building llama.cpp {version} reference tools ({', '.join(TOOLS)}) into {folder / 'build'}; "
        f"once, ~{max(1, round(BUILD_CPU_MINUTES / jobs))} minutes on {jobs} cores")  # fmt: skip
    started = time.monotonic()
    source = unpack_sdist(version, folder, say)
    commit = vendored_commit(source)
    build_dir = folder / "build"
    shutil.rmtree(build_dir, ignore_errors=True)  # an earlier, interrupted build
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(build_dir), *generator,
                 *REFERENCE_CMAKE_ARGS]  # fmt: skip
    _run(configure, folder / "cmake-configure.log", say)
    _run(
        ["cmake", "--build", str(build_dir), "--target", *TOOLS, "-j", str(jobs)],
        folder / "cmake-build.log",
        say,
    )
    tools = tools_in(build_dir)
    if tools is None:
        raise ReferenceError(
            f"the build finished without {TOOLS} in {build_dir}/bin (see {folder}/cmake-build.log)"
        )
    minutes = round((time.monotonic() - started) / 60, 1)
    record = {
        "version": version,
        "commit": commit,
        "cmake_args": list(REFERENCE_CMAKE_ARGS),
        "jobs": jobs,
        "build_minutes": minutes,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (build_dir / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    say(f"built llama.cpp {version} (commit {commit}) in {minutes} minutes: {tools[0].parent}")
    return Reference(*tools, build_dir, "built", version, commit)


def unpack_sdist(version: str, folder: Path, say: Callable[[str], None] = print) -> Path:
    """llama-cpp-python's sdist of `version`, downloaded by pip and unpacked under `folder`."""
    source = folder / f"llama_cpp_python-{version}"
    if (source / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        return source
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                f"{PACKAGE}=={version}", "-d", str(folder)]  # fmt: skip
    _run(download, folder / "pip-download.log", say)
    (archive,) = folder.glob(f"llama_cpp_python-{version}.tar.gz")
    with tarfile.open(archive) as sdist:
        sdist.extractall(folder, filter="tar")
    archive.unlink()
    return source


def vendored_commit(source: Path) -> str | None:
    """The llama.cpp commit the sdist vendors: its submodule's HEAD, which the sdist's git metadata keeps."""
    with contextlib.suppress(OSError):
        head = (source / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD").read_text().strip()
        if len(head) == 40 and all(c in "0123456789abcdef" for c in head):
            return head
    return None


def _run(argv: Sequence[str], log: Path, say: Callable[[str], None]) -> None:
    say(f"  $ {' '.join(argv)}  (log: {log})")
    with log.open("w") as out:
        completed = subprocess.run(list(argv), stdout=out, stderr=subprocess.STDOUT, check=False)
    if completed.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise ReferenceError(f"{argv[0]} {argv[1]} failed ({completed.returncode}); {log} ends:\n{tail}")


def main(argv: Sequence[str] | None = None) -> Reference:
    parser = argparse.ArgumentParser(
        prog="python -m bench.llamacpp_reference", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument(
        "--build-dir", type=Path, default=None, help=f"a llama.cpp build folder (or ${ENV_VAR})"
    )
    args = parser.parse_args(argv)
    reference = locate(args.build_dir)
    assert reference is not None  # locate builds when it finds none
    print(json.dumps(reference.describe(), indent=2))
    return reference


if __name__ == "__main__":
    main()
