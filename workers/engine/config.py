"""Engine configuration: a plain dataclass the worker fills from settings (the engine reads no env)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"
RANDOM_MODEL = "random-tiny"
PLACEHOLDER_MODEL = "placeholder-echo"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    #: A model id: DEFAULT_MODEL, RANDOM_MODEL, PLACEHOLDER_MODEL, a folder, a .gguf file or a hub id.
    model: str = DEFAULT_MODEL
    #: Where converted checkpoints (GGUF -> safetensors) are cached.
    model_cache: Path = Path(".genq/models")
    #: "cpu" or "cuda" (one GPU per process: pick it with CUDA_VISIBLE_DEVICES).
    device: str = "cpu"
    #: "float32", "bfloat16" or "float16"; "auto" picks bf16/fp16 on CUDA and fp32 on CPU.
    dtype: str = "auto"
    #: Most sequences decoded together in one step.
    max_batch_size: int = 16
    #: Most tokens (prompt + generated, over all running sequences) the KV cache holds at once.
    max_batch_tokens: int = 8192
    #: torch intra-op threads; None leaves torch's default.
    torch_threads: int | None = None
    #: Least seconds between two on_output calls for one request (publishing is throttled here).
    output_interval_s: float = 0.25
    #: Seconds per step of the placeholder engine (it has no model to take time).
    placeholder_step_s: float = 0.01
