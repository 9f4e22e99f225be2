"""What keeps a worker's memory near its weights: they stay mapped from the file, tied weights are
one tensor, the KV cache holds the live rows only and starts small again after the batch empties, and the
engine does not import llguidance.torch (which pulls in torch.compile's machinery)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import cast

import torch

from workers.engine.torch.batch import RunningBatch
from workers.engine.torch.kv_cache import SlotKVCache
from workers.engine.torch.loading import LoadedModel

ROOT = Path(__file__).resolve().parents[4]


def _mapped_ranges(name: str) -> list[tuple[int, int]]:
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].endswith(name):
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def test_default_weights_are_the_mapped_file_and_tied_once(default_model: LoadedModel) -> None:
    model = default_model.model
    head = cast(torch.Tensor, model.lm_head.weight)  # get_output_embeddings() is untyped
    embeddings = cast(torch.Tensor, model.get_input_embeddings().weight)
    assert embeddings.data_ptr() == head.data_ptr()  # one 113 MB matrix, not two
    ranges = _mapped_ranges("model.safetensors")
    assert ranges, "the weights file is not memory-mapped"
    copied = [
        name
        for name, parameter in model.named_parameters()
        if not any(start <= parameter.data_ptr() < end for start, end in ranges)
    ]
    assert copied == []  # every weight is read from the page cache, none copied to the heap


def test_kv_cache_holds_live_rows_only(random_model: LoadedModel) -> None:
    layers = random_model.model.config.num_hidden_layers
    cache = SlotKVCache(num_layers=layers, max_rows=16)
    with torch.inference_mode():
        prefill, _ = RunningBatch(random_model.model, max_rows=1).prefill(list(range(10, 20)))
    cache.append(prefill)
    one_row = cache.reserved_bytes
    for _ in range(2):
        cache.append(prefill)
    # Rows grow with the batch (3 live: 4 by doubling), where 16 rows used to be allocated at once.
    assert one_row < cache.reserved_bytes <= 4 * one_row
    while cache.rows:
        cache.remove(cache.rows - 1)
    cache.append(prefill)
    assert cache.reserved_bytes == one_row  # a new burst starts small again, whatever the last one grew


def test_the_engine_does_not_import_torch_compile_helpers() -> None:
    code = "import sys, workers.engine.local; print('llguidance.torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
