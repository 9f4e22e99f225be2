"""Settings of the engine a worker runs: the model's cache, device and dtype, batch bounds, threads,
and the placeholder model's and fault hook's test settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class EngineSettings(BaseModel):
    """The engine."""

    model_cache: Path = Path(".genq/models")
    """Where converted model folders are cached."""

    device: Literal["cpu", "cuda"] = "cpu"
    """Where the model runs; one GPU per worker process (choose it with CUDA_VISIBLE_DEVICES)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Model dtype; auto is bf16/fp16 on CUDA and fp32 on CPU."""

    max_batch_size: int = Field(16, ge=1, le=512)
    """Most sequences decoded together in one engine step."""

    max_batch_tokens: int = Field(8192, ge=64)
    """Most tokens (prompts and outputs of all running sequences) held in the KV cache at once."""

    torch_threads: int | None = Field(None, ge=1)
    """Engine threads in a worker: torch's intra-op threads, and llama.cpp's n_threads and
    n_threads_batch under that backend; default the physical cores (torch's own choice, and what
    the llama.cpp backend counts itself: it never imports torch)."""

    engine_backend: Literal["auto", "torch", "llamacpp"] = "auto"
    """Kernels that run the model: `llamacpp` (llama.cpp via llama-cpp-python; GGUF models on cpu
    only), `torch` (transformers), or `auto`: llamacpp for a GGUF model (the default model) on cpu
    when llama-cpp-python is installed, torch for safetensors/AWQ checkpoints and GPUs."""

    llamacpp_sequence_tokens: int = Field(2048, ge=64)
    """Under llama.cpp: the most tokens (prompt + completion) one job holds."""

    llamacpp_kv_cells: Literal["q8_0", "f16"] = "q8_0"
    """Under llama.cpp: the K and V cells' type. `q8_0` takes half f16's memory (the default KV
    cache, 8192 + 8192 cells: ~190 MiB for the default model, against ~380 in f16); `f16` decodes a
    little faster (llama.cpp's own default)."""

    llamacpp_prefix_cache: bool = True
    """Under llama.cpp: a finished job's row keeps its KV cells, and a later prompt that starts with
    the same tokens (the chat template's system prompt, a conversation's earlier turns) skips their
    prefill, as llama-server's prompt cache does; its logprobs equal a whole prefill's where its
    cells lie in position order (always with llamacpp_batch_invariant; tested on the default
    model). False prefills every prompt whole."""

    llamacpp_cache_tokens: int = Field(8192, ge=0)
    """Under llama.cpp with the prefix cache: the most KV cells finished jobs' rows keep for later
    prompts; past it the row finished longest ago is emptied first. The KV cache, allocated whole at
    start, holds these cells and max_batch_tokens (what running jobs reserve): 8192 + 8192 cells
    are ~190 MiB for the default model in q8_0."""

    llamacpp_batch_invariant: bool = False
    """Under llama.cpp: a job's output is the same token for token whatever runs beside it (its
    solo output). Each row then has a KV stream of its own, llamacpp_sequence_tokens cells, and all
    max_batch_size streams are allocated at start (16 x 2048 cells: ~380 MiB for the default model
    in q8_0, a worker above 0.6 GB). Off (the default), the rows share one KV cache sized to
    max_batch_tokens + llamacpp_cache_tokens, and a job's cells lie where llama.cpp finds room:
    once other jobs have come and gone, attention adds them up in another order than alone, its
    logprobs stay near its solo run's (as near as llama.cpp's are to transformers') and a greedy
    token may differ."""

    placeholder_step_s: float = Field(0.01, ge=0)
    """Seconds per step of the placeholder-echo model (it has no weights to take time); tests
    use it to hold jobs running for a known while."""

    fault_engine_fatal_file: Path | None = None
    """TEST-ONLY fault hook (the chaos benchmark): when this file exists, the worker's engine
    deletes it and fails fatally at its next step. Unset in any real deployment."""
