#!/usr/bin/env bash
# The engine benchmark on a lent GPU machine that cannot receive the default model's 94 MB file
# (the device tool carries at most 64 MiB) nor reach a package index. Two steps:
#
#   bash bench/gpu/engine_h200.sh prepare   # here: the model's config + tokenizer, and py3.12 wheels, into .gpu/
#   bash bench/gpu/engine_h200.sh run       # there (repo root, .gpu/ carried): the benchmark, results in $OUT
#
# It benchmarks SmolLM2-135M-Instruct's config and tokenizer with random weights: the same shapes,
# so the same work per token as the real model; only the text differs (every job generates exactly
# 64 tokens either way). On a GPU host with genq installed, run the real model instead:
#   python -m bench.engine --device cuda
set -uo pipefail
cd "$(dirname "$0")/../.."
WHEELS=(transformers==5.23.0 tokenizers==0.23.3 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2
        truststore==0.10.5 click==8.5.1 regex==2026.11.19 pydantic==2.14.4 pydantic_core==2.50.5
        pydantic-settings==2.16.3 annotated-types==0.8.0 typing-inspection==0.4.5 python-dotenv==1.2.4
        redis==8.1.0 hiredis==3.5.0 opentelemetry-api==1.45.2)

prepare() {
  mkdir -p .gpu/shape .gpu/whl
  grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
  .venv/bin/python - <<'PY'
import shutil, tempfile
from pathlib import Path
from workers.engine.loading import convert_gguf, default_gguf_path
with tempfile.TemporaryDirectory() as tmp:
    folder = convert_gguf(default_gguf_path(), Path(tmp))
    for f in folder.iterdir():  # everything but the weights, and the note naming the GGUF they came from
        if f.is_file() and f.suffix != ".safetensors" and f.name != "genq_source.json":
            shutil.copy(f, Path(".gpu/shape") / f.name)
PY
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/whl "${WHEELS[@]}"
}

run() {
  export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
  python3 - <<'PY' || exit 4
import shutil
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = Path(".gpu/shape"), Path("/tmp/smollm2-135m-random")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.bfloat16)
model.save_pretrained(dst)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
print("torch", torch.__version__, "built", dst, sum(p.numel() for p in model.parameters()), "parameters")
PY
  python3 -m bench.engine --device cuda --model /tmp/smollm2-135m-random --out "${OUT:-bench/results}"
}

"${1:?prepare or run}"
