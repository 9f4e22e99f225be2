"""A GGUF model loaded by llama.cpp's kernels, through llama-cpp-python's low-level binding (its C
API one to one), with the Hugging Face tokenizer built from the same file (extracted once by
../gguf.py, read by ../tokenizer.py's FolderTokenizer: no transformers, no torch): what LlamaCppExecutor
(executor.py) runs. Also where llama.cpp's log goes (ours, warnings and errors only)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.logging import fields
from workers.engine.config import DEFAULT_MODEL, EngineConfig
from workers.engine.gguf import default_gguf_path, gguf_digest, tokenizer_folder
from workers.engine.tokenizer import FolderTokenizer
from workers.engine.types import FatalEngineError

logger = logging.getLogger(__name__)


def available() -> bool:
    """Whether llama-cpp-python is installed (the worker extra installs it)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def gguf_file(model: str) -> Path | None:
    """The GGUF file a model id names (the default model's, or a .gguf path), else None."""
    if model == DEFAULT_MODEL:
        return default_gguf_path()
    path = Path(model)
    return path if path.suffix == ".gguf" and path.is_file() else None


@functools.cache
def binding() -> Any:
    """llama_cpp's C API, its log routed to ours at warning and above (it prints every load detail)."""
    import llama_cpp

    callback = llama_cpp.llama_log_callback(_forward_log)
    _KEPT.append(callback)  # llama.cpp calls it for the life of the process: never collected
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    return llama_cpp


_KEPT: list[Any] = []
#: ggml's log levels that reach our log: WARN (3) and ERROR (4).
_LOGGED_LEVELS = {3: logging.WARNING, 4: logging.ERROR}
#: A warning expected of genq's own context, logged at debug: a shared KV cache (context.py)
#: lets llama.cpp see every sequence as able to fill all of it, past the model's training context,
#: while genq holds each sequence to llamacpp_sequence_tokens (at most that context).
_EXPECTED_WARNING = re.compile(r"llama_context: n_ctx_seq \(\d+\) > n_ctx_train")


def _forward_log(level: int, text: bytes, _: Any) -> None:
    if level in _LOGGED_LEVELS:
        message = text.decode(errors="replace").strip()
        logged = logging.DEBUG if _EXPECTED_WARNING.match(message) else _LOGGED_LEVELS[level]
        logger.log(logged, "llamacpp_log", extra=fields(text=message))


@dataclass(frozen=True, slots=True)
class LlamaCppModel:
    """A GGUF model loaded by llama.cpp (weights mmap'd) and its Hugging Face tokenizer."""

    handle: Any  # llama_model_p
    tokenizer: FolderTokenizer
    fingerprint: str
    label: str
    vocab_size: int
    context_train: int
    eos_token_ids: frozenset[int]


def load_llamacpp_model(config: EngineConfig) -> LlamaCppModel:
    """Load config.model's GGUF file; FatalEngineError when it names none or it cannot load."""
    gguf = gguf_file(config.model)
    if gguf is None:
        raise FatalEngineError(f"the llama.cpp backend needs a GGUF model; {config.model!r} is not one")
    llama = binding()
    params = llama.llama_model_default_params()
    # No repacked/AMX weight buffers: their kernels run only for multi-token batches, so a batched
    # row would not compute as a solo one (and the AMX kernel segfaults on the CPUs measured here).
    params.use_extra_bufts = False
    handle = llama.llama_model_load_from_file(str(gguf).encode(), params)
    if not handle:
        raise FatalEngineError(f"llama.cpp cannot load {gguf}")
    tokenizer = FolderTokenizer(tokenizer_folder(gguf, config.model_cache))
    vocab = llama.llama_model_get_vocab(handle)
    eos = {int(llama.llama_vocab_eos(vocab))}  # as the transformers path: the GGUF eos and the tokenizer's
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    digest = hashlib.sha256(f"llamacpp/{llama.__version__}:{gguf_digest(gguf)}".encode())
    digest.update(str(tokenizer.chat_template or "").encode())
    return LlamaCppModel(
        handle=handle,
        tokenizer=tokenizer,
        fingerprint=digest.hexdigest()[:16],
        label=f"{gguf.stem} (GGUF, llama.cpp {llama.__version__}) on cpu",
        vocab_size=int(llama.llama_vocab_n_tokens(vocab)),
        context_train=int(llama.llama_model_n_ctx_train(handle)),
        eos_token_ids=frozenset(token for token in eos if token >= 0),
    )


def physical_cores() -> int:
    """The physical cores among the CPUs this process may run on (one per set of SMT siblings)."""
    cpus = os.sched_getaffinity(0)
    cores = set()
    for cpu in cpus:
        try:
            cores.add(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text())
        except OSError:  # no sysfs topology (a container may hide it): count what may run
            return len(cpus)
    return max(1, len(cores))
