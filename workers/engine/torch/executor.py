"""ModelExecutor: the Executor (../executor.py) of a transformers causal LM over a RunningBatch.

Each prompt is prefilled alone (batch.py), its first token chosen from its logits; every row then
decodes together. Each row's token is chosen by ../sampling/choice.py (penalties, grammar mask, sampling,
logprobs: the step every backend shares, in numpy on the host: host_logits); with prompt_logprobs
the prompt is prefilled at every position to score it. A decode step that runs out of device
memory is retried once (a transient spike can clear); any failure of a decode step escapes to the
core, for which it is fatal.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from workers.engine.config import EngineConfig
from workers.engine.prompts import tokenize
from workers.engine.sampling.choice import TokenChooser
from workers.engine.sampling.logprobs import prompt_logprobs
from workers.engine.sampling.structured import Grammars
from workers.engine.sequence import Sequence
from workers.engine.torch.batch import RunningBatch
from workers.engine.torch.cpu_linear import use_transposed_linear
from workers.engine.torch.loading import LoadedModel, load_model
from workers.engine.types import NO_CACHE, CacheStats, FatalEngineError

#: Tokens generated per row in the warm-up step.
_WARMUP_STEPS = 2


class ModelExecutor:
    """A transformers causal LM over a RunningBatch (see the module docstring)."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self._config = config
        self._loaded = loaded
        self._batch: RunningBatch[Sequence] | None = None
        self._grammars: Grammars | None = None
        self._pending: DynamicCache | None = None  # the last prefill's cache, until join()
        self._chooser: TokenChooser | None = None

    @property
    def loaded(self) -> LoadedModel:
        if self._loaded is None:
            raise RuntimeError("the engine has no model loaded")
        return self._loaded

    @property
    def grammars(self) -> Grammars:
        if self._grammars is None:
            raise RuntimeError("the engine is not started")
        return self._grammars

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.loaded.model.config.get_text_config().vocab_size)

    @property
    def fingerprint(self) -> str:
        return self.loaded.fingerprint

    @property
    def label(self) -> str:
        return self.loaded.label

    @property
    def rows(self) -> int:
        return 0 if self._batch is None else self._batch.rows

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.loaded.eos_token_ids

    @property
    def context_tokens(self) -> float:
        return self.loaded.context_tokens

    def prepare(self) -> None:
        """Load the model (unless given), build the batch and the response-format compiler, warm up."""
        loaded = self._loaded = self._loaded or load_model(self._config)
        if self._config.fast_cpu_linear:
            use_transposed_linear(loaded.model)
        self._batch = RunningBatch(loaded.model, max_rows=self._config.max_batch_size)
        self._batch.share_prefix(template_prefix(loaded.tokenizer))
        # llguidance's view of the tokenizer waits for the first response format (../sampling/structured.py).
        self._grammars = Grammars(loaded.tokenizer, self.vocab_size)
        self._chooser = TokenChooser(loaded.eos_token_ids)
        self._warm_up(self._batch)

    def prefill(self, sequence: Sequence) -> int | None:
        params = sequence.request.params
        scored = params.prompt_logprobs
        cache, logits = self._require_batch().prefill(sequence.prompt_ids, every_position=scored is not None)
        self._pending = cache
        host = host_logits(logits)  # one transfer from the device for both uses
        if scored is not None:
            sequence.prompt_scores = prompt_logprobs(host[:-1], sequence.prompt_ids, scored)
        return self._choose(host[-1:], [sequence])[0] if params.max_tokens else None

    def join(self, sequence: Sequence) -> None:
        if self._pending is None:
            raise RuntimeError("join() without a prefill")
        self._require_batch().join(sequence, self._pending)
        self._pending = None

    def decode(self) -> list[tuple[Sequence, list[int]]]:
        batch = self._require_batch()
        members = batch.members
        logits = self._forward_with_retry(batch, [sequence.completion[-1] for sequence in members])
        tokens = self._choose(host_logits(logits), members)
        return [(sequence, [token]) for sequence, token in zip(members, tokens, strict=True)]

    def release(self, sequences: list[Sequence]) -> None:
        batch = self._require_batch()
        # Highest row first: the rows left keep the order they would have with one leave() at a time.
        for sequence in sorted(sequences, key=batch.row, reverse=True):
            batch.leave(sequence)

    def take_mask_stats(self) -> tuple[float, int]:
        return self._require_chooser().take_mask_stats()

    def take_cache_stats(self) -> CacheStats:
        return NO_CACHE  # every prompt is prefilled whole

    def close(self) -> None:
        """Nothing to free outside Python's heap."""

    def _choose(self, logits: np.ndarray, sequences: list[Sequence]) -> list[int]:
        return self._require_chooser().choose(logits, sequences)

    def _require_chooser(self) -> TokenChooser:
        if self._chooser is None:
            raise RuntimeError("the engine is not started")
        return self._chooser

    @staticmethod
    def _forward_with_retry(batch: RunningBatch[Sequence], last_tokens: list[int]) -> torch.Tensor:
        try:
            return batch.decode(last_tokens)
        except torch.OutOfMemoryError:
            # A transient spike (another process, fragmentation) can clear; a second failure is fatal.
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return batch.decode(last_tokens)

    def _warm_up(self, batch: RunningBatch[Sequence]) -> None:
        """One short generation at the largest batch shape, so the first job pays no allocation."""
        prompt = [int(token) for token in self.loaded.tokenizer("Hello").input_ids] or [0]
        if not batch.warm_up(prompt, _WARMUP_STEPS):
            message = f"refusing to serve {self._config.model}: warm-up logits are NaN or infinite"
            raise FatalEngineError(message)

    def _require_batch(self) -> RunningBatch[Sequence]:
        if self._batch is None:
            raise RuntimeError("the engine is not started")
        return self._batch


def template_prefix(tokenizer: Any) -> list[int]:
    """The tokens every chat prompt starts with (system block, user header): two renders' common prefix."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    first, second = (tokenize(tokenizer, "", [{"role": "user", "content": text}]) for text in ("a", "b"))
    size = 0
    while size < min(len(first), len(second)) and first[size] == second[size]:
        size += 1
    return first[:size]


def host_logits(logits: torch.Tensor) -> np.ndarray:
    """Logits as the fp32, row-contiguous numpy array token choice reads (../sampling/choice.py): no copy for
    contiguous fp32 on the CPU (the transposed linear layer's output is not: one copy then); from
    a GPU, one transfer of [rows, vocab] per step (6 MB at 32 rows of SmolLM2's vocabulary)."""
    return logits.detach().float().contiguous().cpu().numpy()
