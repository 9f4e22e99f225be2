"""workers/engine/config.py: an EngineConfig out of bounds is refused when it is made (the worker
fails at start-up, not per job), with a message naming the field and the value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from shared.config import Settings
from workers.engine.config import EngineConfig
from workers.worker import engine_config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be >= 1, got 0"),
        ({"max_batch_tokens": 0}, "max_batch_tokens must be >= 1, got 0"),
        ({"max_prefill_tokens_per_step": 0}, "max_prefill_tokens_per_step must be >= 1, got 0"),
        ({"output_interval_s": -1.0}, "output_interval_s must be >= 0, got -1.0"),
        ({"device": "tpu"}, "device must be 'cpu' or 'cuda', got 'tpu'"),
        ({"dtype": "int8"}, "dtype must be auto, float32, bfloat16 or float16, got 'int8'"),
        ({"llamacpp_kv_cells": "q4_0"}, "llamacpp_kv_cells must be one of ['f16', 'q8_0'], got 'q4_0'"),
    ],
)
def test_out_of_bounds_values_are_refused_by_name(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        EngineConfig(**overrides)
    assert str(caught.value) == message


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_devices_accepted(device: str) -> None:
    assert EngineConfig(device=device).device == device


def test_defaults_are_a_valid_cpu_config() -> None:
    config = EngineConfig()
    assert (config.device, config.dtype, config.fault_file) == ("cpu", "auto", None)
    assert config.max_batch_size >= 1 and config.max_prefill_tokens_per_step >= 1


@pytest.mark.parametrize("cells", ["q8_0", "f16"])
def test_the_workers_setting_chooses_the_kv_cells(make_settings: Callable[..., Settings], cells: str) -> None:
    """GENQ_LLAMACPP_KV_CELLS reaches the engine a worker builds (workers/worker.py); a type the
    setting does not know is refused by name when the settings are read."""
    assert engine_config(make_settings(llamacpp_kv_cells=cells)).llamacpp_kv_cells == cells
    with pytest.raises(ValidationError, match="llamacpp_kv_cells"):
        make_settings(llamacpp_kv_cells="q4_0")
