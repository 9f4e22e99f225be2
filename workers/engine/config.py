"""Engine configuration: a plain dataclass the worker fills from settings (the engine reads no env)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workers.engine.types import FatalEngineError, StepStats

DEFAULT_MODEL = "smollm2-135m-instruct"
RANDOM_MODEL = "random-tiny"
PLACEHOLDER_MODEL = "placeholder-echo"
#: EngineConfig.backend's values.
BACKENDS = ("auto", "torch", "llamacpp")
#: The llama.cpp K/V cell types a worker may choose, as ggml's type numbers (ggml.h's ggml_type).
KV_CELL_TYPES = {"q8_0": 8, "f16": 1}


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
    #: Which kernels run the model: "torch" (transformers), "llamacpp" (llama.cpp, GGUF models on
    #: CPU only) or "auto" (llamacpp for a GGUF model on CPU when llama-cpp-python is installed,
    #: else torch). See workers/engine/__init__.py.
    backend: str = "auto"
    #: Under llama.cpp: the most tokens (prompt + completion) one sequence holds.
    llamacpp_sequence_tokens: int = 2048
    #: Under llama.cpp: the K and V cells' type, "q8_0" or "f16" (half the memory, or faster).
    llamacpp_kv_cells: str = "q8_0"
    #: Under llama.cpp: a released row keeps its KV cells, and a later prompt starting with the same
    #: tokens reuses them instead of prefilling them again (llamacpp/executor.py). Off: every prompt
    #: is prefilled whole.
    llamacpp_prefix_cache: bool = True
    #: Under llama.cpp with the prefix cache: the most KV cells released rows keep for later
    #: prompts; past it the least recently released row's cells are dropped. With
    #: max_batch_tokens it sizes the KV cache (llamacpp/context.py).
    llamacpp_cache_tokens: int = 8192
    #: Under llama.cpp: each row its own KV stream of llamacpp_sequence_tokens cells, all allocated
    #: at start, so a sequence's output equals its solo output token for token; off, one KV cache
    #: shared by the rows, sized to max_batch_tokens + llamacpp_cache_tokens (llamacpp/context.py).
    llamacpp_batch_invariant: bool = False
    #: torch intra-op threads; None leaves torch's default.
    torch_threads: int | None = None
    #: Least seconds between two on_output calls for one request (publishing is throttled here).
    output_interval_s: float = 0.25
    #: Seconds per step of the placeholder engine (it has no model to take time).
    placeholder_step_s: float = 0.01
    #: Wrap a raw `prompt` as one user message of the chat template (when the tokenizer has one).
    #: Instruct models answer garbage to bare text, so True is what users expect; False tokenizes it as-is.
    prompt_as_chat: bool = True
    #: Most prompt tokens prefilled in one engine step (at least one prompt is always admitted), so a
    #: burst of new jobs stalls the running ones for a bounded time. Bounds: >= 1.
    max_prefill_tokens_per_step: int = 2048
    #: Compute small-batch products of fp32 CPU linear layers as (W @ x^T)^T, which MKL runs 1.3-3x
    #: faster than F.linear for decode-sized batches here (see torch/cpu_linear.py). Patches the
    #: model in place.
    fast_cpu_linear: bool = True
    #: TEST-ONLY fault hook: when this file exists at a step, the engine deletes it and dies as if
    #: the step had failed fatally (the chaos benchmark uses it). None in any real deployment.
    fault_file: Path | None = None
    #: Called on the engine thread after every step with its StepStats (metrics export). Must be cheap.
    on_step: Callable[[StepStats], None] | None = None
    #: Called once, on the engine thread, when the engine dies, before any in-flight request is
    #: failed (the worker hands its jobs back to the queue and exits non-zero).
    on_fatal: Callable[[FatalEngineError], None] | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.max_prefill_tokens_per_step < 1:
            raise ValueError(
                f"max_prefill_tokens_per_step must be >= 1, got {self.max_prefill_tokens_per_step}"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.llamacpp_kv_cells not in KV_CELL_TYPES:
            raise ValueError(
                f"llamacpp_kv_cells must be one of {sorted(KV_CELL_TYPES)}, got {self.llamacpp_kv_cells!r}"
            )
        if self.llamacpp_sequence_tokens < 64:
            raise ValueError(f"llamacpp_sequence_tokens must be >= 64, got {self.llamacpp_sequence_tokens}")
        if self.llamacpp_cache_tokens < 0:
            raise ValueError(f"llamacpp_cache_tokens must be >= 0, got {self.llamacpp_cache_tokens}")
        if self.output_interval_s < 0:
            raise ValueError(f"output_interval_s must be >= 0, got {self.output_interval_s}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
