"""AWQ 4-bit through the production loader: built here with gptqmodel, served by the engine, checked
against the same model unquantized.

The checkpoint is SmolLM2-135M-Instruct with its first 6 decoder layers quantized to int4 (group size
64) and the rest left in float, declared in the checkpoint's `modules_to_not_convert`. Quantizing all
30 layers takes ~2 min on 2 cores (6 take ~30 s), and int4 error compounded over all 30 layers of a
135M model drifts too far to compare (greedy text turns to noise on some prompts). It is built once
into the model cache, keyed by the source and the gptqmodel version, so reruns reuse it.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest
import torch
from transformers import BatchEncoding

from tests.workers.engine.conftest import ROOT
from workers.engine import GenerationRequest, SamplingParams
from workers.engine.config import EngineConfig
from workers.engine.gguf import build_once, default_gguf_path
from workers.engine.local import LocalEngine
from workers.engine.torch.loading import LoadedModel, convert_gguf, load_model

pytestmark = pytest.mark.slow

QUANTIZED_LAYERS = 6
PROMPTS = ["What is the capital of France?", "Write a poem about the ocean.", "How do I bake bread?"]
GENERATED = 24


def _gptqmodel_version() -> str:
    try:
        return importlib.metadata.version("gptqmodel")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(
            "gptqmodel is not installed: AWQ on CPU needs `pip install --no-deps gptqmodel==7.6.0` plus its "
            "runtime deps (see the engine report); 7.7.0 requires torch>=2.14.1"
        )


def _awq_checkpoint(source: Path, cache: Path, version: str) -> Path:
    def build(folder: Path) -> None:
        command = [sys.executable, "-m", "tests.workers.engine.torch.awq_build", str(source), str(folder)]
        subprocess.run(
            [*command, str(QUANTIZED_LAYERS)], check=True, cwd=ROOT, timeout=600, capture_output=True
        )

    return build_once(cache / f"test-{source.name}-awq{QUANTIZED_LAYERS}-g64-gptqmodel{version}", build)


def test_awq_checkpoint_serves_close_to_the_unquantized_model(
    default_model: LoadedModel, model_cache: Path
) -> None:
    version = _gptqmodel_version()
    source = convert_gguf(default_gguf_path(), model_cache)
    checkpoint = _awq_checkpoint(source, model_cache, version)

    awq = load_model(EngineConfig(model=str(checkpoint), torch_threads=1))
    assert "AWQ 4-bit" in awq.label
    layers = awq.model.model.layers
    assert "awq" in type(layers[0].self_attn.q_proj).__name__.lower(), "layer 0 is not an int4 AWQ layer"
    assert type(layers[QUANTIZED_LAYERS].self_attn.q_proj) is torch.nn.Linear

    engine = LocalEngine(EngineConfig(model=str(checkpoint), torch_threads=1, max_batch_size=4), awq)
    engine.start()
    try:
        sampling = SamplingParams(max_tokens=GENERATED, ignore_eos=True)
        futures = [
            engine.submit(GenerationRequest(f"awq{i}", sampling, messages=[{"role": "user", "content": p}]))
            for i, p in enumerate(PROMPTS)
        ]
        texts = [future.result(120).text for future in futures]
    finally:
        engine.shutdown(30)

    cosines, agreements = [], []
    for prompt, text in zip(PROMPTS, texts, strict=True):
        prompt_ids = cast(  # a BatchEncoding: return_dict defaults to True
            BatchEncoding,
            awq.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True
            ),
        )["input_ids"]
        ids = torch.tensor([prompt_ids + awq.tokenizer(text).input_ids])
        with torch.inference_mode():  # both models read the AWQ engine's own output, position by position
            quantized = awq.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
            exact = default_model.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
        assert torch.isfinite(quantized).all()
        cosines.append(torch.nn.functional.cosine_similarity(quantized, exact, dim=-1))
        agreements.append((quantized.argmax(-1) == exact.argmax(-1)).float())
    cosine = torch.cat(cosines).mean().item()
    agreement = torch.cat(agreements).mean().item()
    assert cosine > 0.95, f"AWQ logits drift from the unquantized model's: mean cosine {cosine:.3f}"
    assert agreement > 0.75, f"AWQ greedy tokens agree with the unquantized model's on only {agreement:.0%}"
