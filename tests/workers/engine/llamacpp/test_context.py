"""The llama.cpp context's KV cache: sized to the tokens a batch holds by default, a stream per row in
the batch-invariant layout (workers/engine/llamacpp/context.py), chosen by the worker's settings."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from shared.config import Settings
from workers.engine.config import DEFAULT_MODEL, EngineConfig
from workers.engine.llamacpp.context import KvLayout, context_params, kv_layout
from workers.engine.llamacpp.model import LlamaCppModel, binding
from workers.worker import engine_config


def test_the_default_cache_holds_what_running_jobs_reserve_and_the_prefix_cache_keeps() -> None:
    assert kv_layout(EngineConfig()) == KvLayout(shared=True, cells=8192 + 8192, rows=16)
    rows = EngineConfig(max_batch_size=64, max_batch_tokens=4096, llamacpp_cache_tokens=1024)
    assert kv_layout(rows) == KvLayout(shared=True, cells=4096 + 1024, rows=64)  # rows add no cells
    assert kv_layout(EngineConfig(llamacpp_prefix_cache=False)).cells == 8192  # nothing kept
    # A job larger than max_batch_tokens runs alone: the cache holds its whole context.
    assert kv_layout(EngineConfig(max_batch_tokens=512, llamacpp_cache_tokens=0)).cells == 2048


def test_the_batch_invariant_layout_gives_every_row_a_stream_of_a_jobs_tokens() -> None:
    config = EngineConfig(max_batch_size=4, llamacpp_sequence_tokens=1024, llamacpp_batch_invariant=True)
    assert kv_layout(config) == KvLayout(shared=False, cells=4 * 1024, rows=4)


def test_the_workers_setting_chooses_the_layout(make_settings: Callable[..., Settings]) -> None:
    """GENQ_LLAMACPP_BATCH_INVARIANT reaches the engine a worker builds (workers/worker.py)."""
    assert kv_layout(engine_config(make_settings())).shared
    assert not kv_layout(engine_config(make_settings(llamacpp_batch_invariant=True))).shared


def test_llama_cpp_creates_the_context_the_layout_asks_for(
    llamacpp_model: LlamaCppModel, model_cache: Path
) -> None:
    """The pinned llama.cpp takes the parameters as given: one cache of the layout's cells (padded
    to 256) that any sequence may fill up to its context, or a stream of a job's tokens per row."""
    llama = binding()
    for invariant, per_sequence in ((False, 3 * 256), (True, 256)):
        config = EngineConfig(
            model=DEFAULT_MODEL, model_cache=model_cache, max_batch_size=3, max_batch_tokens=500,
            llamacpp_sequence_tokens=256, llamacpp_cache_tokens=200, llamacpp_batch_invariant=invariant,
        )  # fmt: skip
        context = llama.llama_init_from_model(llamacpp_model.handle, context_params(llama, config, 1, 64, 64))
        try:
            assert context
            assert int(llama.llama_n_ctx(context)) == 3 * 256  # 700 cells, or 3 streams of 256
            assert int(llama.llama_n_ctx_seq(context)) == per_sequence
        finally:
            llama.llama_free(context)


def test_a_shared_cache_past_the_training_context_is_no_warning(
    llamacpp_model: LlamaCppModel, model_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """llama.cpp warns when a sequence could fill more cells than the model was trained on: in the
    default shared cache of 16384 cells every sequence could, but genq holds each to its
    llamacpp_sequence_tokens, so a worker's log stays free of it (at debug)."""
    llama = binding()
    config = EngineConfig(model=DEFAULT_MODEL, model_cache=model_cache)
    assert kv_layout(config).cells > llamacpp_model.context_train
    with caplog.at_level(logging.DEBUG, logger="workers.engine.llamacpp.model"):
        context = llama.llama_init_from_model(llamacpp_model.handle, context_params(llama, config, 1, 64, 64))
        llama.llama_free(context)
    logged = [record for record in caplog.records if "n_ctx_train" in str(record.__dict__)]
    assert logged and all(record.levelno == logging.DEBUG for record in logged)
