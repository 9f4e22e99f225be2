"""Loading: atomic, locked conversions; refusing checkpoints that do not match their model."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from workers.engine.config import EngineConfig
from workers.engine.continuous import TransformersEngine
from workers.engine.gguf import build_once
from workers.engine.loading import LoadedModel, load_model
from workers.engine.types import FatalEngineError


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


def test_checkpoint_missing_a_weight_is_refused(random_model: LoadedModel, tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    random_model.model.save_pretrained(folder)
    random_model.tokenizer.save_pretrained(folder)
    assert load_model(EngineConfig(model=str(folder))).fingerprint  # intact: it loads
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        FatalEngineError, match=r"missing_keys \(e\.g\. model\.layers\.1\.mlp\.down_proj\.weight\)"
    ):
        load_model(EngineConfig(model=str(folder)))
    engine = TransformersEngine(EngineConfig(model=str(folder)))
    with pytest.raises(FatalEngineError):
        engine.start()


def test_folder_fingerprint_is_stable_and_tracks_weights(random_model: LoadedModel, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    random_model.model.save_pretrained(folder)
    random_model.tokenizer.save_pretrained(folder)
    first = load_model(EngineConfig(model=str(folder))).fingerprint
    assert load_model(EngineConfig(model=str(folder))).fingerprint == first
    weights = load_file(folder / "model.safetensors")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt", "touched": "yes"})
    assert load_model(EngineConfig(model=str(folder))).fingerprint != first
