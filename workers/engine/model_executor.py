"""ModelExecutor: the Executor (executor.py) of a transformers causal LM over a RunningBatch.

Each prompt is prefilled alone (batch.py), its first token chosen from its logits; every row then
decodes together. Sampling: each row's logits are first adjusted by its own min_tokens, logit_bias
and penalties (penalties.py, vLLM's order), then masked by its response format's grammar
(structured.py), then greedy at temperature 0, else temperature + top-p with a per-request generator
(sampling.py). With SamplingParams.logprobs each chosen token's raw log-probability is kept
(logprobs.py: before any adjustment, as vLLM); with prompt_logprobs the prompt is prefilled at every
position to score it. A decode step that runs out of device memory is retried once (a transient
spike can clear); any failure of a decode step escapes to the core, for which it is fatal.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import DynamicCache

from workers.engine.batch import RunningBatch
from workers.engine.config import EngineConfig
from workers.engine.cpu_linear import use_transposed_linear
from workers.engine.loading import LoadedModel, load_model
from workers.engine.logprobs import prompt_logprobs, step_logprobs
from workers.engine.penalties import adjust_logits
from workers.engine.sampling import choose_tokens
from workers.engine.sequence import Sequence
from workers.engine.structured import Grammars, mask_logits
from workers.engine.types import FatalEngineError

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
        self._mask_s = 0.0
        self._masked_rows = 0

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
    def rows(self) -> int:
        return 0 if self._batch is None else self._batch.rows

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.loaded.eos_token_ids

    @property
    def context_tokens(self) -> float:
        return self.loaded.context_tokens

    def prepare(self) -> None:
        """Load the model (unless given), build the batch and the grammars, warm up."""
        loaded = self._loaded = self._loaded or load_model(self._config)
        if self._config.fast_cpu_linear:
            use_transposed_linear(loaded.model)
        self._batch = RunningBatch(loaded.model, max_rows=self._config.max_batch_size)
        self._batch.share_prefix(template_prefix(loaded.tokenizer))
        # Built here (~0.4 s), not by the first structured request while it holds up the others.
        self._grammars = Grammars(loaded.tokenizer, int(loaded.model.config.get_text_config().vocab_size))
        self._warm_up(self._batch)

    def prefill(self, sequence: Sequence) -> int | None:
        params = sequence.request.params
        scored = params.prompt_logprobs
        cache, logits = self._require_batch().prefill(sequence.prompt_ids, every_position=scored is not None)
        self._pending = cache
        if scored is not None:
            sequence.prompt_scores = prompt_logprobs(logits[:-1], sequence.prompt_ids, scored)
        return self._choose(logits[-1:], [sequence])[0] if params.max_tokens else None

    def join(self, sequence: Sequence) -> None:
        if self._pending is None:
            raise RuntimeError("join() without a prefill")
        self._require_batch().join(sequence, self._pending)
        self._pending = None

    def decode(self) -> list[tuple[Sequence, int]]:
        batch = self._require_batch()
        members = batch.members
        logits = self._forward_with_retry(batch, [sequence.completion[-1] for sequence in members])
        return list(zip(members, self._choose(logits, members), strict=True))

    def release(self, sequences: list[Sequence]) -> None:
        batch = self._require_batch()
        # Highest row first: the rows left keep the order they would have with one leave() at a time.
        for sequence in sorted(sequences, key=batch.row, reverse=True):
            batch.leave(sequence)

    def take_mask_stats(self) -> tuple[float, int]:
        stats = self._mask_s, self._masked_rows
        self._mask_s, self._masked_rows = 0.0, 0
        return stats

    def _choose(self, logits: torch.Tensor, sequences: list[Sequence]) -> list[int]:
        """One token per row of logits [rows, vocab]: each row's adjustments, then its sampling."""
        params = [sequence.request.params for sequence in sequences]
        adjusted = adjust_logits(
            logits,
            params,
            [sequence.prompt_ids for sequence in sequences],
            [sequence.completion for sequence in sequences],
            self.loaded.eos_token_ids,
        )
        matchers = [sequence.matcher for sequence in sequences]
        if any(matcher is not None for matcher in matchers):
            began = time.perf_counter()
            adjusted = mask_logits(adjusted, logits, matchers)
            self._mask_s += time.perf_counter() - began
            self._masked_rows += sum(matcher is not None for matcher in matchers)
        tokens = choose_tokens(adjusted, params, [sequence.generator for sequence in sequences])
        # Scored on the raw logits: vLLM's default, independent of penalties and temperature.
        scores = step_logprobs(logits, tokens, [row_params.logprobs for row_params in params])
        for sequence, score in zip(sequences, scores, strict=True):
            if score is not None:
                sequence.scores.append(score)
        return tokens

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


def tokenize(tokenizer: Any, prompt: str, messages: list[dict[str, str]] | None) -> list[int]:
    """A raw prompt's tokens, or the chat template's rendering of `messages` (with the generation prompt)."""
    if messages is None:
        return list(tokenizer(prompt).input_ids)
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded if isinstance(encoded, list) else encoded["input_ids"])
