"""Fixtures for the engine tests: real models, loaded once per session, one CPU thread.

The default model is converted from its GGUF file into <repo>/.genq/models on first use (~25 s,
then < 1 s); random-tiny needs only the tokenizer from the same file. `backend_engine` builds
default-model engines on each backend (transformers, llama.cpp) for the tests of their contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from workers.engine.config import DEFAULT_MODEL, RANDOM_MODEL, EngineConfig
from workers.engine.llamacpp.executor import LlamaCppExecutor
from workers.engine.llamacpp.model import LlamaCppModel, load_llamacpp_model
from workers.engine.local import LocalEngine
from workers.engine.torch.loading import LoadedModel, load_model

# Two shared cores: one thread keeps runs comparable and leaves a core to everyone else.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[3]
MODEL_CACHE = ROOT / ".genq" / "models"

EngineFactory = Callable[..., LocalEngine]


@pytest.fixture(scope="session")
def model_cache() -> Path:
    return MODEL_CACHE


@pytest.fixture(scope="session")
def default_model(model_cache: Path) -> LoadedModel:
    return load_model(EngineConfig(model=DEFAULT_MODEL, model_cache=model_cache, torch_threads=1))


@pytest.fixture(scope="session")
def random_model(model_cache: Path) -> LoadedModel:
    return load_model(EngineConfig(model=RANDOM_MODEL, model_cache=model_cache, torch_threads=1))


@pytest.fixture(scope="session")
def llamacpp_model(model_cache: Path) -> LlamaCppModel:
    return load_llamacpp_model(EngineConfig(model=DEFAULT_MODEL, model_cache=model_cache, torch_threads=1))


def _factory(
    loaded: LoadedModel | LlamaCppModel, model_id: str, model_cache: Path
) -> Iterator[EngineFactory]:
    engines: list[LocalEngine] = []

    def make(**overrides: Any) -> LocalEngine:
        config = replace(EngineConfig(model=model_id, model_cache=model_cache, torch_threads=1), **overrides)
        if isinstance(loaded, LlamaCppModel):
            engine = LocalEngine(config, executor=LlamaCppExecutor(config, loaded))
        else:
            engine = LocalEngine(config, loaded)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown(timeout=30)


@pytest.fixture
def default_engine(default_model: LoadedModel, model_cache: Path) -> Iterator[EngineFactory]:
    """Builds started engines over the session's default model; shuts them down after the test."""
    yield from _factory(default_model, DEFAULT_MODEL, model_cache)


@pytest.fixture
def random_engine(random_model: LoadedModel, model_cache: Path) -> Iterator[EngineFactory]:
    """Builds started engines over the session's random-tiny model; shuts them down after the test."""
    yield from _factory(random_model, RANDOM_MODEL, model_cache)


@pytest.fixture
def llamacpp_engine(llamacpp_model: LlamaCppModel, model_cache: Path) -> Iterator[EngineFactory]:
    """Builds started llama.cpp engines over the session's default GGUF model."""
    yield from _factory(llamacpp_model, DEFAULT_MODEL, model_cache)


@pytest.fixture(params=["torch", "llamacpp"])
def backend_engine(request: pytest.FixtureRequest, model_cache: Path) -> Iterator[EngineFactory]:
    """Builds started default-model engines on one backend per parameter (the test's id names it)."""
    fixture = "default_model" if request.param == "torch" else "llamacpp_model"
    yield from _factory(request.getfixturevalue(fixture), DEFAULT_MODEL, model_cache)
