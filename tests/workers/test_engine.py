"""workers/engine/__init__.py: which engine and which kernels a model id gets, before anything
loads (build_engine returns an engine not started)."""

from __future__ import annotations

import pytest

from workers.engine import EngineConfig, build_engine, choose_backend
from workers.engine.config import DEFAULT_MODEL, PLACEHOLDER_MODEL
from workers.engine.llamacpp.executor import LlamaCppExecutor
from workers.engine.local import LocalEngine
from workers.engine.placeholder.engine import PlaceholderEngine
from workers.engine.torch.executor import ModelExecutor
from workers.engine.types import FatalEngineError


def test_backend_choice() -> None:
    gguf = EngineConfig(model=DEFAULT_MODEL)
    assert choose_backend(gguf) == "llamacpp"
    assert choose_backend(EngineConfig(model=DEFAULT_MODEL, backend="torch")) == "torch"
    assert choose_backend(EngineConfig(model="some/folder")) == "torch"
    assert choose_backend(EngineConfig(model=DEFAULT_MODEL, device="cuda")) == "torch"
    with pytest.raises(FatalEngineError, match="GGUF models on cpu"):
        choose_backend(EngineConfig(model="some/folder", backend="llamacpp"))


def test_the_placeholder_model_gets_the_placeholder_engine() -> None:
    assert isinstance(build_engine(EngineConfig(model=PLACEHOLDER_MODEL)), PlaceholderEngine)


@pytest.mark.parametrize(("backend", "executor"), [("auto", LlamaCppExecutor), ("torch", ModelExecutor)])
def test_the_default_model_runs_on_the_chosen_kernels(backend: str, executor: type) -> None:
    engine = build_engine(EngineConfig(model=DEFAULT_MODEL, backend=backend))
    assert isinstance(engine, LocalEngine)
    assert isinstance(engine._executor, executor)  # the one seam where backends differ
