"""The layout's promises, checked on the source. The rules are the team's style guide's
(STYLE.md in the kit beside this repository, ../shared/STYLE.md, "The layout tells the
architecture"), stated here so they need no other file: the tiers never import each other,
shared/ imports no tier, the engine imports no Celery and its backends import no other backend
(ENGINE_BACKENDS); the worker's modules import each other without a circle (its runtime lives in
the leaf module workers/context.py); the API's rooms import one way (API_ROOMS); and the tests
mirror the source tree (one test module per source module with logic)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports_at_run_time(path: Path) -> set[str]:
    """Modules `path` imports when it runs (any depth of the file, TYPE_CHECKING blocks aside)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("api", "workers"), ("workers", "api"), ("shared", "api"), ("shared", "workers"),
     ("workers/engine", "celery")],
)  # fmt: skip
def test_a_package_does_not_import(package: str, forbidden: str) -> None:
    offenders = {
        _module(path): sorted(m for m in imports_at_run_time(path) if m.split(".")[0] == forbidden)
        for path in sources(package)
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_worker_modules_import_no_circle() -> None:
    modules = {_module(p): p for p in sorted((ROOT / "workers").glob("*.py"))}
    graph = {name: {m for m in imports_at_run_time(path) if m in modules and m != name}
             for name, path in modules.items()}  # fmt: skip

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in graph[start]
        )

    circles = sorted(name for name in graph if reaches(name, name, {name}))
    assert circles == [], f"modules in an import circle: {circles}"


#: The engine's backends, each a subpackage of workers/engine named as EngineConfig.backend names it
#: (the placeholder's by its model id), and what every backend shares beside the engine's own
#: modules. A backend imports no other backend, and what they share imports none, so a new backend
#: (its own subpackage) changes no other. A new subpackage takes its place here.
ENGINE_BACKENDS = ("llamacpp", "torch", "placeholder")
ENGINE_SHARED = ("sampling",)


def test_every_engine_subpackage_is_a_backend_or_shared() -> None:
    subpackages = {path.parent.name for path in (ROOT / "workers" / "engine").glob("*/__init__.py")}
    assert subpackages - {*ENGINE_BACKENDS, *ENGINE_SHARED} == set(), (
        "add it to ENGINE_BACKENDS or ENGINE_SHARED"
    )


def test_engine_backends_import_no_other_backend() -> None:
    """workers/engine/llamacpp/ never imports workers.engine.torch (nor the reverse), and sampling/
    imports no backend: a backend's weight (torch, llama.cpp) stays with the workers that run it."""
    crossing: dict[str, list[str]] = {}
    for owner in (*ENGINE_BACKENDS, *ENGINE_SHARED):
        others = {f"workers.engine.{backend}" for backend in ENGINE_BACKENDS if backend != owner}
        for path in sources(f"workers/engine/{owner}"):
            found = sorted(
                m for m in imports_at_run_time(path) if any(m == o or m.startswith(f"{o}.") for o in others)
            )
            if found:
                crossing[_module(path)] = found
    assert crossing == {}


#: The API's rooms, each importing only rooms after it: the routes (HTTP resources, the hot path)
#: over the services they serve (batches over OpenAI's request shapes over the job queue) over
#: the edge (who may ask what: the request pipeline, auth, errors, rate and concurrency limits,
#: body caps, metrics, the uvicorn adapter) over the Redis I/O it and the queue run on. api/app.py
#: sits above them all and no room imports it. A new room takes its place here.
API_ROOMS = ("routes", "batches", "openai", "jobs", "edge", "redis_io")


def api_room(module: str) -> str | None:
    """The room of an api/ module or name (`api.jobs.queue` -> "jobs"); None outside the rooms
    (api/app.py, api/ itself, other tiers)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "api" and len(parts) > 1 and parts[1] in API_ROOMS else None


def test_every_api_room_has_its_place_in_the_order() -> None:
    rooms = {path.parent.name for path in (ROOT / "api").glob("*/__init__.py")}
    assert rooms - set(API_ROOMS) == set(), "add the new room to API_ROOMS, in its place"


def test_api_rooms_import_one_way() -> None:
    """A room imports only rooms after it in API_ROOMS (never the app): routes -> batches ->
    openai -> jobs -> edge -> redis_io."""
    backwards: dict[str, list[str]] = {}
    for path in sources("api"):
        importer = _module(path)
        room = api_room(importer)
        if room is None:
            continue
        for name in imports_at_run_time(path):
            target = api_room(name)
            if name == "api.app" or (target is not None and API_ROOMS.index(target) < API_ROOMS.index(room)):
                backwards.setdefault(importer, []).append(name)
    assert backwards == {}, f"imports against the rooms' order {API_ROOMS}: {backwards}"


def test_shared_holds_only_what_more_than_one_tier_uses() -> None:
    """A module of shared/ that one tier alone imports (and no other shared/ module) lives with
    that tier: shared/ is what the API and the workers (or the CLI) have in common."""
    users: dict[str, set[str]] = {_module(p): set() for p in sources("shared") if p.name != "__init__.py"}
    for package in ("api", "workers", "cli", "shared"):
        for path in sources(package):
            importer = _module(path)
            for name in imports_at_run_time(path):
                for module in (name, name.rsplit(".", 1)[0]):
                    if module in users and module != importer:
                        users[module].add(package)
    lone = {
        module: sorted(tiers) for module, tiers in users.items() if len(tiers) == 1 and "shared" not in tiers
    }
    assert lone == {}, f"modules of shared/ with a single consumer: {lone}"


def test_lua_lives_in_lua_files() -> None:
    """Redis scripts are shared/jobqueue/lua/*.lua (table-tested state machines), never strings in Python."""
    inline = [_module(p) for package in ("api", "shared", "workers", "cli") for p in sources(package)
              if "redis.call(" in p.read_text()]  # fmt: skip
    assert inline == []


def _has_logic(path: Path) -> bool:
    """A function or method with a body beyond a docstring, `...` or `pass` (a Protocol's
    signatures and plain declarations are not logic)."""
    trivial = (ast.Pass, ast.Expr)
    return any(
        not all(isinstance(statement, trivial) for statement in node.body)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def mirrored_test(path: Path) -> Path:
    """Where a source module's tests live: module `a.b.c` (a/b/c.py, or a/b/c/__init__.py) is
    tested by tests/a/b/test_c.py."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ROOT.joinpath("tests", *parts[:-1], f"test_{parts[-1]}.py")


#: Modules with logic whose tests live elsewhere, and why. Keep it short: each entry is a debt.
MIRROR_EXCEPTIONS: dict[str, str] = {}


def test_tests_mirror_the_source_tree() -> None:
    """Each source module with logic has its own test module at the mirrored path (issue 17): a
    maintainer changing a/b/c.py finds its tests in tests/a/b/test_c.py."""
    missing = [
        _module(path)
        for package in ("api", "workers", "shared", "cli")
        for path in sources(package)
        if _has_logic(path) and not mirrored_test(path).exists() and _module(path) not in MIRROR_EXCEPTIONS
    ]
    assert missing == [], f"source modules with logic and no tests/<same path>/test_<name>.py: {missing}"
