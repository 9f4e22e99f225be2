"""The llama.cpp context a LlamaCppExecutor runs (executor.py): its parameters, chiefly how
its KV cache is laid out, and the KV cells each seq_id (row) holds, through llama.cpp's public
memory API only.

llama.cpp allocates the whole KV cache when it creates the context and zeroes it, so every cell is
resident from the start: the cache's size is the worker's memory. Two layouts
(EngineConfig.llamacpp_batch_invariant):

- shared (the default): one cache for all rows (kv_unified) of max_batch_tokens (what running
  sequences may reserve, or one sequence's whole context if larger) + llamacpp_cache_tokens (what
  released rows keep for the prefix cache) cells, as llama-server's unified cache: sized to the
  tokens a batch holds, not to max_batch_size x llamacpp_sequence_tokens. A copied prefix is
  shared, not duplicated (llama_memory_seq_cp marks the same cells). A sequence's cells lie where
  llama.cpp found room, and attention sums them in cell order: once rows have come and gone, a
  sequence's order differs from a solo run's, and so may the last bits of its logits (rarely a
  greedy token).
- batch-invariant: one stream per row (kv_unified=False) of llamacpp_sequence_tokens cells, each
  sequence's cells in position order whatever runs beside it, so batched output equals solo output
  token for token (tests/workers/engine/test_default_model.py), at max_batch_size streams
  resident. llama.cpp runs a batch as one forward pass per run of consecutive seq_ids here: the
  executor keeps the running rows one run (rows.py).

Either way the K/V cells are llamacpp_kv_cells (8-bit by default, half f16's memory) and attention
is llama.cpp's flash attention, which a quantized V cache needs. A seq_id's cells are its
positions 0 .. n-1: genq fills a row from position 0 and drops only a suffix or all of it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from workers.engine.config import KV_CELL_TYPES, EngineConfig


@dataclass(frozen=True, slots=True)
class KvLayout:
    """How a context's KV cache is laid out (see the module docstring)."""

    #: One cache for every row (kv_unified), else a stream per row.
    shared: bool
    #: KV cells in all (llama.cpp's n_ctx, before it pads them to a multiple of 256).
    cells: int
    #: seq_ids (llama.cpp's n_seq_max): a running sequence's, or a free one keeping cells.
    rows: int


def kv_layout(config: EngineConfig) -> KvLayout:
    """The KV cache an executor of `config` creates."""
    rows = config.max_batch_size
    if config.llamacpp_batch_invariant:
        return KvLayout(shared=False, cells=rows * config.llamacpp_sequence_tokens, rows=rows)
    running = max(config.max_batch_tokens, config.llamacpp_sequence_tokens)
    kept = config.llamacpp_cache_tokens if config.llamacpp_prefix_cache else 0
    return KvLayout(shared=True, cells=running + kept, rows=rows)


def context_params(llama: Any, config: EngineConfig, threads: int, batch_tokens: int, outputs: int) -> Any:
    """The llama_context_params of an executor: kv_layout(config)'s cache, `batch_tokens` a
    llama_decode at most (also the physical batch), of which at most `outputs` get logits (llama.cpp
    sizes its logits buffers for them), `threads`."""
    layout = kv_layout(config)
    params = llama.llama_context_default_params()
    params.n_seq_max = layout.rows
    params.n_ctx = layout.cells
    params.kv_unified = layout.shared
    params.n_batch = params.n_ubatch = batch_tokens
    params.n_outputs_max = outputs
    params.n_threads = params.n_threads_batch = threads
    params.type_k = params.type_v = KV_CELL_TYPES[config.llamacpp_kv_cells]
    params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
    params.no_perf = True
    return params


def sequence_tokens(llama: Any, context: Any, config: EngineConfig) -> int:
    """The most tokens one sequence may hold in `context`: its stream's cells (llama.cpp pads them),
    or llamacpp_sequence_tokens of the shared cache."""
    if kv_layout(config).shared:
        return config.llamacpp_sequence_tokens
    return int(llama.llama_n_ctx_seq(context))


class KvCells:
    """The KV cells each seq_id of one context holds: counted, copied, dropped. Called from the
    engine's thread only, between llama_decode calls."""

    def __init__(self, llama: Any, context: Any, layout: KvLayout) -> None:
        self._llama, self._context, self._layout = llama, context, layout
        self._memory = llama.llama_get_memory(context)
        # copy()'s buffer between streams, kept (a fresh one costs a page fault per page).
        self._state: ctypes.Array[ctypes.c_uint8] = (ctypes.c_uint8 * 0)()

    def held(self, row: int) -> int:
        """Cells `row` holds (0 when empty): its highest position + 1."""
        return int(self._llama.llama_memory_seq_pos_max(self._memory, row)) + 1

    def keep(self, row: int, count: int) -> None:
        """Drop `row`'s cells from position `count` on."""
        self._llama.llama_memory_seq_rm(self._memory, row, count, -1)

    def empty(self, row: int) -> None:
        """Drop all of `row`'s cells."""
        self._llama.llama_memory_seq_rm(self._memory, row, -1, -1)

    def clear(self) -> None:
        """Drop every row's cells (their metadata: zeroing the data again would gain nothing, as
        a row's attention masks every cell it has not written)."""
        self._llama.llama_memory_clear(self._memory, False)

    def copy(self, source: int, target: int) -> None:
        """Give `target` (emptied first) `source`'s cells at the same positions; `source` keeps them.
        In the shared cache the cells are marked as the target's too (no data moves); between streams
        only the cells held move, through llama.cpp's sequence state, where llama_memory_seq_cp
        would copy every cell of the stream."""
        if self._layout.shared:
            self.empty(target)
            self._llama.llama_memory_seq_cp(self._memory, source, target, -1, -1)
            return
        llama = self._llama
        size = int(llama.llama_state_seq_get_size(self._context, source))
        if len(self._state) < size:
            self._state = (ctypes.c_uint8 * size)()
        written = int(llama.llama_state_seq_get_data(self._context, self._state, size, source))
        # set_data empties `target` and fills it from its first cell.
        if not written or not llama.llama_state_seq_set_data(self._context, self._state, written, target):
            raise RuntimeError(f"llama.cpp could not copy seq_id {source}'s cells to {target}")
