"""The default GGUF model as llama.cpp loads it (workers/engine/llamacpp/model.py): which model ids
name a GGUF file, what the loaded model reports, and a model id that is no GGUF refused clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workers.engine.config import DEFAULT_MODEL, EngineConfig
from workers.engine.gguf import default_gguf_path
from workers.engine.llamacpp.model import LlamaCppModel, available, gguf_file, load_llamacpp_model
from workers.engine.types import FatalEngineError

pytestmark = pytest.mark.slow


def test_model_ids_that_name_a_gguf_file(tmp_path: Path) -> None:
    assert available()  # the worker extra installs llama-cpp-python
    assert gguf_file(DEFAULT_MODEL) == default_gguf_path()
    model = tmp_path / "mine.gguf"
    assert gguf_file(str(model)) is None  # not there
    model.write_bytes(b"GGUF")
    assert gguf_file(str(model)) == model
    assert gguf_file("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a hub id


def test_the_model_is_the_gguf_file(llamacpp_model: LlamaCppModel) -> None:
    assert "GGUF, llama.cpp" in llamacpp_model.label
    assert llamacpp_model.vocab_size == 49152 and llamacpp_model.eos_token_ids == frozenset({2})


def test_a_model_that_is_no_gguf_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FatalEngineError, match="needs a GGUF model; 'HuggingFaceTB/x' is not one"):
        load_llamacpp_model(EngineConfig(model="HuggingFaceTB/x", model_cache=tmp_path))


#: Run in a fresh interpreter: the worker's imports, its engine on the default GGUF (llama.cpp),
#: started, one job through it that samples, is penalised, masked by a schema and scored; then
#: which model code (and whether torch) was ever imported.
_WORKER_LIKE = """
import sys
from pathlib import Path
import workers.worker
from workers.engine import EngineConfig, GenerationRequest, SamplingParams, build_engine
config = EngineConfig(model_cache=Path(sys.argv[1]), max_batch_size=2, llamacpp_sequence_tokens=256)
engine = build_engine(config)
engine.start()
params = SamplingParams(
    max_tokens=4, temperature=0.7, seed=1, repetition_penalty=1.1, logprobs=2, json_schema='{"type":"object"}'
)
result = engine.submit(GenerationRequest("r", params, prompt="Hi")).result(timeout=120)
assert result.logprobs and result.text.startswith("{"), result
engine.shutdown()
model_code = (
    "transformers.modeling_utils", "transformers.activations", "accelerate", "workers.engine.torch.batch",
    "torch",
)
print(result.completion_tokens, *(name for name in model_code if name in sys.modules))
"""


def test_the_llamacpp_worker_never_imports_transformers_model_code_or_torch(model_cache: Path) -> None:
    """transformers' model code (modeling_utils, torchao through it; a model config's activations,
    accelerate) is ~230 MB resident and seconds of start-up a llama.cpp worker has no use for: only
    the tokenizer is transformers'. torch is ~200 MB more: token choice (sampling, penalties, grammar
    masks, logprobs) runs in numpy."""
    done = subprocess.run(
        [sys.executable, "-c", _WORKER_LIKE, str(model_cache)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["4"]  # a job ran, and none of that code was imported
