"""Loading: refusing checkpoints that do not match their model (the build-once step every conversion
uses is gguf.py's: tests/workers/engine/test_gguf.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from workers.engine.config import EngineConfig
from workers.engine.local import LocalEngine
from workers.engine.torch.loading import LoadedModel, load_model
from workers.engine.types import FatalEngineError


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
    engine = LocalEngine(EngineConfig(model=str(folder)))
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
