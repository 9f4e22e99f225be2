"""LlamaCppExecutor: the Executor (../executor.py) of a GGUF model run by llama.cpp's kernels.

Through llama-cpp-python's low-level binding, not its `Llama` class: the engine's own loop
(../core.py) schedules, and llama.cpp only runs forward passes. Each running sequence holds a seq_id
(its row) in one llama_context; a decode step is one llama_decode over one token per row; prefill
runs one prompt alone, in chunks of BATCH_TOKENS.

The context's KV cache (context.py) is by default one cache shared by the rows, sized to
the tokens a batch holds; with EngineConfig.llamacpp_batch_invariant each row has its own stream,
and batched output equals solo output token for token (with plain weight kernels: see
model.py), the running rows then kept one run of consecutive seq_ids (rows.py).

Prefix cache: a released sequence keeps its cells, and a later prompt that starts with the same
tokens takes that seq_id and prefills only the rest (EngineConfig.llamacpp_prefix_cache, as
llama-server's per-slot prompt cache), or gets a copy of its cells in another seq_id
(rows.PrefixMatch). The cells free seq_ids keep are bounded (llamacpp_cache_tokens).

Logits are viewed in llama.cpp's buffer without a copy; token choice is ../sampling/choice.py's, in numpy, so
a worker on this executor never imports torch. Tokenization and the chat template stay with the
Hugging Face tokenizer built from the same GGUF file (model.py)."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from workers.engine.config import EngineConfig
from workers.engine.llamacpp.context import KvCells, context_params, kv_layout, sequence_tokens
from workers.engine.llamacpp.model import LlamaCppModel, binding, load_llamacpp_model, physical_cores
from workers.engine.llamacpp.rows import SeqIds
from workers.engine.sampling.choice import TokenChooser
from workers.engine.sampling.logprobs import RawLogprob, prompt_logprobs
from workers.engine.sampling.structured import Grammars
from workers.engine.sequence import Sequence
from workers.engine.types import NO_CACHE, CacheStats, FatalEngineError

#: Most tokens one llama_decode call takes (a longer prompt is fed in chunks): also llama.cpp's
#: physical batch, so its compute buffers stay small.
BATCH_TOKENS = 512
#: Prompt tokens per llama_decode when the prompt is scored (prompt_logprobs, every position's
#: logits): llama.cpp's logits buffers hold as many rows of the vocabulary as one call outputs, and
#: keep their size for the context's life (512 rows of the default model's are 96 MiB each).
SCORED_TOKENS = 64
#: Tokens generated per row in the warm-up step.
_WARMUP_STEPS = 2


class LlamaCppExecutor:
    """A GGUF model on llama.cpp's CPU kernels, one seq_id per row (see the module docstring)."""

    def __init__(self, config: EngineConfig, model: LlamaCppModel | None = None) -> None:
        self._config = config
        self._model = model
        self._llama: Any = None
        self._context: Any = None  # llama_context_p
        self._kv: KvCells | None = None  # the context's cells (prepare)
        self._batch: Any = None  # llama_batch, BATCH_TOKENS tokens
        self._context_tokens = 0
        self._threads = 0  # fixed by prepare()
        self._grammars: Grammars | None = None
        self._chooser: TokenChooser | None = None
        self._rows: dict[Sequence, int] = {}  # each running sequence's seq_id
        self._seq_ids = SeqIds(0)
        self._pending: tuple[Sequence, int] | None = None  # the last prefill's sequence and row
        self._moves = 0  # sequences moved to another seq_id by _pack_rows
        self._copies = 0  # prefixes copied from a free seq_id's cells into a new sequence's
        self._reused = 0  # prompt tokens whose KV cells a prefill found in its seq_id
        self._evicted = 0  # free seq_ids whose kept cells were dropped (llamacpp_cache_tokens)
        self._cache_taken = NO_CACHE  # the running totals at the last take_cache_stats()
        self._decode_s = 0.0  # wall seconds inside llama_decode (decode_seconds)

    # ---- facts -----------------------------------------------------------------------------------

    @property
    def model(self) -> LlamaCppModel:
        if self._model is None:
            raise RuntimeError("the engine has no model loaded")
        return self._model

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def fingerprint(self) -> str:
        return self.model.fingerprint

    @property
    def label(self) -> str:
        return f"{self.model.label}, {self.threads} threads"

    @property
    def threads(self) -> int:
        """llama.cpp's threads: EngineConfig.torch_threads (the engine's one thread setting), else
        the physical cores this process may run on (torch's default, and llama.cpp's own)."""
        return self._threads or self._config.torch_threads or physical_cores()

    @property
    def grammars(self) -> Grammars:
        if self._grammars is None:
            raise RuntimeError("the engine is not started")
        return self._grammars

    @property
    def rows(self) -> int:
        return len(self._rows)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.model.eos_token_ids

    @property
    def context_tokens(self) -> float:
        return self._context_tokens

    def seq_id(self, sequence: Sequence) -> int:
        """The llama.cpp seq_id (row) a joined sequence holds."""
        return self._rows[sequence]

    @property
    def moves(self) -> int:
        """Sequences moved to another seq_id so far, to keep the running rows one run."""
        return self._moves

    @property
    def kv(self) -> KvCells:
        """The context's KV cells, by seq_id (context.py)."""
        if self._kv is None:
            raise RuntimeError("the engine is not started")
        return self._kv

    @property
    def copies(self) -> int:
        """Prompts that got a copy of a free seq_id's cells for their prefix (PrefixMatch.copy_from)."""
        return self._copies

    @property
    def cache_totals(self) -> CacheStats:
        """The prefix cache since prepare(): prompt tokens not prefilled because their seq_id held
        their cells, free seq_ids emptied to keep within llamacpp_cache_tokens, tokens kept now."""
        return CacheStats(self._reused, self._evicted, self._seq_ids.held_tokens)

    def cells(self, seq_id: int) -> int:
        """KV cells a seq_id holds (0 when empty): its highest position + 1."""
        return self.kv.held(seq_id)

    # ---- the Executor protocol -----------------------------------------------------------------

    def prepare(self) -> None:
        """Load the model (unless given), create the context (its KV cache), warm up."""
        model = self._model = self._model or load_llamacpp_model(self._config)
        llama = self._llama = binding()
        self._threads = self.threads
        self._grammars = Grammars(model.tokenizer, model.vocab_size)
        self._chooser = TokenChooser(model.eos_token_ids)
        outputs = max(self._config.max_batch_size, SCORED_TOKENS)  # a decode's, a scored chunk's
        params = context_params(llama, self._config, self.threads, BATCH_TOKENS, outputs)
        self._context = llama.llama_init_from_model(model.handle, params)
        if not self._context:
            raise FatalEngineError(f"llama.cpp cannot create a context for {self._config.model}")
        layout = kv_layout(self._config)
        self._kv = KvCells(llama, self._context, layout)
        self._batch = llama.llama_batch_init(BATCH_TOKENS, 0, 1)
        self._context_tokens = min(sequence_tokens(llama, self._context, self._config), model.context_train)
        self._seq_ids = SeqIds(layout.rows, one_run=not layout.shared)
        self._warm_up()

    def prefill(self, sequence: Sequence) -> int | None:
        self._drop_pending()
        params = sequence.request.params
        scored = params.prompt_logprobs
        # Scoring the prompt needs the logits at every position: nothing of it may be skipped.
        reusable = sequence.prompt_ids if self._config.llamacpp_prefix_cache and scored is None else ()
        match = self._seq_ids.take(self._rows.values(), reusable)
        self._pending = (sequence, match.row)
        try:
            if match.copy_from is not None:  # the prefix's cells stay in their seq_id for a later prompt
                self.kv.copy(match.copy_from, match.row)
                self._copies += 1
            self.kv.keep(match.row, match.cached_tokens)
            scores: list[RawLogprob] = [RawLogprob(None)]  # the first token has none
            scorer = None if scored is None else _scorer(sequence.prompt_ids, scored, scores)
            logits = self._run_prompt(match.row, sequence.prompt_ids, match.cached_tokens, scorer)
        except BaseException:
            self._drop_pending(keep=False)
            raise
        self._reused += match.cached_tokens
        sequence.cached_tokens = match.cached_tokens
        if scored is not None:
            sequence.prompt_scores = scores
        if not params.max_tokens:
            self._drop_pending()
            return None
        return self._require_chooser().choose(logits, [sequence])[0]

    def join(self, sequence: Sequence) -> None:
        if self._pending is None or self._pending[0] is not sequence:
            raise RuntimeError("join() without its prefill")
        self._rows[sequence] = self._pending[1]
        self._pending = None

    def decode(self) -> list[tuple[Sequence, list[int]]]:
        self._drop_pending()  # a prefill whose first token ended it never joined
        self._pack_rows()
        members = sorted(self._rows, key=self._rows.__getitem__)  # one run, in order: one forward pass
        batch = self._batch
        for index, sequence in enumerate(members):
            position = len(sequence.prompt_ids) + len(sequence.completion) - 1
            set_token(batch, index, sequence.completion[-1], position, self._rows[sequence], True)
        batch.n_tokens = len(members)
        self._forward(batch)
        tokens = self._require_chooser().choose(self._logits(len(members)), members)
        return [(sequence, [token]) for sequence, token in zip(members, tokens, strict=True)]

    def release(self, sequences: list[Sequence]) -> None:
        for sequence in sequences:
            self._free_row(sequence, self._rows[sequence], keep=True)
            del self._rows[sequence]  # after: `rows` reaching 0 means the cells are settled

    def take_mask_stats(self) -> tuple[float, int]:
        return self._require_chooser().take_mask_stats()

    @property
    def decode_seconds(self) -> float:
        """Wall seconds inside llama_decode since the context was made (llama.cpp's compute; the
        rest of a run is genq's own work: bench/engine_reference.py reports the share)."""
        return self._decode_s

    def take_cache_stats(self) -> CacheStats:
        last, self._cache_taken = self._cache_taken, self.cache_totals
        return self._cache_taken.since(last)

    def close(self) -> None:
        """Free the context and the batch (the KV cache's memory); the model stays loaded."""
        if self._context:
            self._llama.llama_batch_free(self._batch)
            self._llama.llama_free(self._context)
            self._context = self._batch = self._kv = None

    # ---- llama.cpp calls -------------------------------------------------------------------------

    def _run_prompt(
        self, row: int, prompt_ids: list[int], first: int = 0, scored: Scorer | None = None
    ) -> np.ndarray:
        """Feed a prompt from position `first` on (the row's cells hold the ones before) to `row` in
        chunks of BATCH_TOKENS; the next token's logits [1, vocab], valid until the next llama_decode.
        With `scored`, every position's logits are computed, in chunks of SCORED_TOKENS, and each
        chunk's go to scored(start, logits [chunk, vocab]) (row i predicts token start + i + 1)."""
        size = BATCH_TOKENS if scored is None else SCORED_TOKENS
        batch, outputs = self._batch, 1
        for start in range(first, len(prompt_ids), size):
            chunk = prompt_ids[start : start + size]
            last = start + len(chunk) == len(prompt_ids)
            for index, token in enumerate(chunk):
                wanted = scored is not None or (last and index == len(chunk) - 1)
                set_token(batch, index, token, start + index, row, wanted)
            batch.n_tokens = len(chunk)
            self._forward(batch)
            if scored is not None:
                outputs = len(chunk)
                scored(start, self._logits(outputs))
        return self._logits(outputs)[-1:]

    def _forward(self, batch: Any) -> None:
        began = time.perf_counter()
        status = int(self._llama.llama_decode(self._context, batch))
        self._decode_s += time.perf_counter() - began
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} ({batch.n_tokens} tokens)")

    def _logits(self, outputs: int) -> np.ndarray:
        """The last llama_decode's logits [outputs, vocab], in batch order: a view of llama.cpp's
        buffer (no copy), valid until the next llama_decode."""
        pointer = self._llama.llama_get_logits(self._context)
        shape = (outputs, self.model.vocab_size)
        floats = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(floats, shape)

    def _pack_rows(self) -> None:
        """Make the running rows one run of consecutive seq_ids (rows.SeqIds.packing)."""
        for source, gap in self._seq_ids.packing(self._rows.values()):
            moved = next(sequence for sequence, row in self._rows.items() if row == source)
            self.kv.copy(source, gap)
            self.kv.empty(source)
            self._rows[moved] = gap
            self._moves += 1

    def _drop_pending(self, keep: bool = True) -> None:
        """Free the row of a prefilled sequence that never joined (it ended at its first token, or
        failed: then its cells are dropped, as they may not hold what the prefill meant to write)."""
        if self._pending is not None:
            sequence, row = self._pending
            self._pending = None
            self._free_row(sequence, row, keep)

    def _free_row(self, sequence: Sequence, row: int, keep: bool) -> None:
        """Give `row` back; with `keep` (and the prefix cache on), its cells stay for a later prompt
        that starts as this sequence's prompt and completion did."""
        if keep and self._config.llamacpp_prefix_cache:
            held = (sequence.prompt_ids + sequence.completion)[: self.cells(row)]
            self._seq_ids.give_back(row, held)
            for evicted in self._seq_ids.evict(self._config.llamacpp_cache_tokens):
                self.kv.empty(evicted)
                self._evicted += 1
        else:
            self._seq_ids.give_back(row)
            self.kv.empty(row)

    def _warm_up(self) -> None:
        """Prefill every row and decode _WARMUP_STEPS tokens (the largest decode shape, so the first
        job does not pay for llama.cpp's first graphs), then empty the cache. Refuses non-finite
        logits."""
        rows = self._config.max_batch_size
        prompts = [[int(token) for token in self.tokenizer(f"Hello {row}").input_ids] for row in range(rows)]
        tokens = [int(self._run_prompt(row, prompts[row]).argmax()) for row in range(rows)]
        finite = True
        for step in range(_WARMUP_STEPS):
            for row, token in enumerate(tokens):
                set_token(self._batch, row, token, len(prompts[row]) + step, row, True)
            self._batch.n_tokens = rows
            self._forward(self._batch)
            logits = self._logits(rows)
            finite = finite and bool(np.isfinite(logits).all())
            tokens = logits.argmax(axis=-1).tolist()
        self.kv.clear()
        if not finite:
            message = f"refusing to serve {self._config.model}: warm-up logits are NaN or infinite"
            raise FatalEngineError(message)

    def _require_chooser(self) -> TokenChooser:
        if self._chooser is None:
            raise RuntimeError("the engine is not started")
        return self._chooser


#: What _run_prompt gives each chunk's logits of a scored prompt: the chunk's first position, and
#: its logits [chunk, vocab] (a view valid during the call).
Scorer = Callable[[int, np.ndarray], None]


def _scorer(prompt_ids: list[int], top: int, scores: list[RawLogprob]) -> Scorer:
    """A Scorer that appends each chunk's prompt tokens' log-probabilities to `scores`."""

    def score(start: int, logits: np.ndarray) -> None:
        ids = prompt_ids[start : start + len(logits) + 1]  # the last row predicts no prompt token
        scores.extend(prompt_logprobs(logits[: len(ids) - 1], ids, top)[1:])

    return score


def set_token(batch: Any, index: int, token: int, position: int, row: int, logits: bool) -> None:
    """Put `token` at `position` of seq_id `row` in slot `index` of a llama_batch (its logits
    computed when `logits`)."""
    batch.token[index] = token
    batch.pos[index] = position
    batch.n_seq_id[index] = 1
    batch.seq_id[index][0] = row
    batch.logits[index] = logits
