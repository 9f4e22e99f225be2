"""The default GGUF model as llama.cpp loads it (workers/engine/llamacpp_model.py): which model ids
name a GGUF file, what the loaded model reports, and a model id that is no GGUF refused clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.engine.config import DEFAULT_MODEL, EngineConfig
from workers.engine.llamacpp_model import LlamaCppModel, available, gguf_file, load_llamacpp_model
from workers.engine.loading import default_gguf_path
from workers.engine.types import FatalEngineError

pytestmark = pytest.mark.slow


def test_model_ids_that_name_a_gguf_file(tmp_path: Path) -> None:
    assert available()  # the worker extra installs llama-cpp-python
    assert gguf_file(DEFAULT_MODEL) == default_gguf_path()
    model = tmp_path / "mine.gguf"
    assert gguf_file(str(model)) is None  # not there
    model.write_bytes(b"GGUF")
    assert gguf_file(str(model)) == model
    assert gguf_file("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a hub id


def test_the_model_is_the_gguf_file(llamacpp_model: LlamaCppModel) -> None:
    assert "GGUF, llama.cpp" in llamacpp_model.label
    assert llamacpp_model.vocab_size == 49152 and llamacpp_model.eos_token_ids == frozenset({2})


def test_a_model_that_is_no_gguf_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FatalEngineError, match="needs a GGUF model; 'HuggingFaceTB/x' is not one"):
        load_llamacpp_model(EngineConfig(model="HuggingFaceTB/x", model_cache=tmp_path))
