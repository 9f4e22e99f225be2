"""Build a small AWQ checkpoint on CPU with gptqmodel (run as a subprocess by test_awq.py).

    python -m tests.workers.engine.torch.awq_build SOURCE_FOLDER OUTPUT_FOLDER

A subprocess because gptqmodel sets process-wide state (thread pools, torch threads) that the
engine tests should not inherit.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # it sizes worker pools from the core count

import torch
from gptqmodel import BACKEND, GPTQModel, QuantizeConfig
from gptqmodel.quantization.config import FORMAT, METHOD
from transformers import AutoTokenizer

#: Divides SmolLM2's hidden (576) and MLP (1536) sizes, as AWQ groups must.
GROUP_SIZE = 64

CALIBRATION = [
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of his house.",
    "Machine learning is the study of computer algorithms that improve automatically through experience.",
    "Paris is the capital and most populous city of France, with about two million residents.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Photosynthesis is the process by which green plants use sunlight to make food from carbon dioxide.",
    "The stock market fell sharply on Monday as investors worried about rising interest rates.",
    "Once upon a time, in a small village by the sea, there lived a girl who loved to paint the waves.",
    "To bake bread, mix flour, water, salt and yeast, knead the dough, let it rise, then bake it.",
]


def build(source: str, output: str, quantized_layers: int) -> None:
    tokenizer = AutoTokenizer.from_pretrained(source)
    chats = [
        tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False)
        for text in CALIBRATION[:4]
    ]
    # Layers past `quantized_layers` stay unquantized ("-:" = skip): quantizing all 30 layers takes ~2 min
    # here, and int4 error compounding over 30 layers of a 135M model leaves too little signal to compare.
    skip = rf"-:model\.layers\.(?!({'|'.join(str(i) for i in range(quantized_layers))})\.).*"
    config = QuantizeConfig(
        bits=4,
        group_size=GROUP_SIZE,
        quant_method=METHOD.AWQ,
        format=FORMAT.GEMM,
        offload_to_disk=False,
        dynamic={skip: {}},
    )
    # AWQ packing takes fp16/bf16 weights; the engine serves the result in fp32.
    model = GPTQModel.load(source, config, dtype=torch.bfloat16)
    model.quantize(CALIBRATION + chats, batch_size=1, tokenizer=tokenizer, backend=BACKEND.AWQ_TORCH)
    model.save(output)
    _declare_unconverted(Path(output), quantized_layers)


def _declare_unconverted(output: Path, quantized_layers: int) -> None:
    # transformers ignores gptqmodel's `dynamic` skips: without this it builds int4 layers for every
    # layer and finds float weights for the skipped ones (the loader then refuses the checkpoint).
    config_path = output / "config.json"
    config = json.loads(config_path.read_text())
    layers = int(config["num_hidden_layers"])
    quantization = config["quantization_config"]
    skipped = [f"model.layers.{i}" for i in range(quantized_layers, layers)]
    quantization["modules_to_not_convert"] = [*(quantization.get("modules_to_not_convert") or []), *skipped]
    config_path.write_text(json.dumps(config, indent=2))


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2], int(sys.argv[3]))
