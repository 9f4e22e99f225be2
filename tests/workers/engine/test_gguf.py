"""GGUF files on disk (workers/engine/gguf.py): the default model's file, a file's identity, its
tokenizer's own folder, and the atomic, locked build-once step every cached artefact uses."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.workers.engine.conftest import MODEL_CACHE
from workers.engine.gguf import build_once, default_gguf_path, gguf_digest, tokenizer_folder

pytestmark = pytest.mark.slow


def test_the_default_model_is_the_packaged_gguf_file() -> None:
    path = default_gguf_path()
    assert path.suffix == ".gguf" and "SmolLM2-135M-Instruct" in path.name
    assert path.read_bytes()[:4] == b"GGUF"


def test_a_files_identity_is_its_size_and_first_mibs(tmp_path: Path) -> None:
    first, same, longer = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    first.write_bytes(b"GGUF" + b"x" * 100)
    same.write_bytes(b"GGUF" + b"x" * 100)  # another name, the same bytes
    longer.write_bytes(b"GGUF" + b"x" * 101)
    assert gguf_digest(first) == gguf_digest(same) != gguf_digest(longer)


def test_the_tokenizer_folder_holds_the_tokenizer_alone() -> None:
    """No config.json beside it: AutoTokenizer would then load the model's config class and, with
    it, transformers' model code, which a llama.cpp worker never needs."""
    folder = tokenizer_folder(default_gguf_path(), MODEL_CACHE)
    assert folder.name.startswith("tokenizer-") and folder.parent == MODEL_CACHE
    assert (folder / "tokenizer.json").is_file() and not (folder / "config.json").exists()
    assert tokenizer_folder(default_gguf_path(), MODEL_CACHE) == folder  # built once, then found


def test_a_crashed_build_leaves_nothing_that_loads(tmp_path: Path) -> None:
    target = tmp_path / "converted"

    def crash(folder: Path) -> None:
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt  # the process dying mid-conversion

    with pytest.raises(KeyboardInterrupt):
        build_once(target, crash)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []

    built = build_once(target, lambda folder: (folder / "config.json").write_text("{}"))
    assert built == target and (target / "config.json").read_text() == "{}"


def test_concurrent_builders_build_once(tmp_path: Path) -> None:
    target, builds = tmp_path / "converted", []

    def slow_build(folder: Path) -> None:
        builds.append(folder)
        (folder / "weights").write_bytes(b"x" * 1000)

    threads = [threading.Thread(target=build_once, args=(target, slow_build)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert (target / "weights").stat().st_size == 1000
