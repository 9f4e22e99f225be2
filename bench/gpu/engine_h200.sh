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
# What bench.engine imports that the machine's image lacks, or has at another version; their
# versions come from constraints.txt, so they are the ones the project runs here.
WHEELS=(transformers tokenizers huggingface_hub httpx2 httpcore2 truststore click regex pydantic pydantic_core
        pydantic-settings annotated-types typing-inspection python-dotenv redis hiredis opentelemetry-api)

pinned() {  # NAME==VERSION as constraints.txt pins each name ('-', '_' and '.' alike, as pip compares)
  for name in "$@"; do
    grep -i -E "^${name//[-_.]/[-_.]}==" constraints.txt || { echo "$name is not in constraints.txt" >&2; exit 2; }
  done
}

prepare() {
  local wheels; wheels=$(pinned "${WHEELS[@]}") || exit 2
  mkdir -p .gpu/shape .gpu/whl
  grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
  .venv/bin/python - <<'PY'
import shutil, tempfile
from pathlib import Path
from workers.engine.gguf import default_gguf_path
from workers.engine.torch.loading import convert_gguf
with tempfile.TemporaryDirectory() as tmp:
    folder = convert_gguf(default_gguf_path(), Path(tmp))
    for f in folder.iterdir():  # everything but the weights, and the note naming the GGUF they came from
        if f.is_file() and f.suffix != ".safetensors" and f.name != "genq_source.json":
            shutil.copy(f, Path(".gpu/shape") / f.name)
PY
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/whl $wheels
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
  python3 -m bench.engine --device cuda --model /tmp/smollm2-135m-random --out "${OUT:-/tmp/engine-gpu}"  # bench/results/engine_gpu.json is a copy of this run's engine.json
}

"${1:?prepare or run}"
