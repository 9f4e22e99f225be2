"""The pages of each row's KV stream past the cells it holds, handed back to the kernel.

llama.cpp keeps one KV stream per row (kv_unified=False) in one buffer: per layer a K and a V
tensor of [cells per row x rows], each row's stream one contiguous slice. genq fills a row from
position 0 and only ever drops a suffix or the whole row, so the cells a sequence holds are cells
0 .. n-1 (tests/workers/engine/test_kv_pages.py checks this on the pinned llama.cpp).

A stream's pages past its last cell hold nothing anyone reads, yet once written they hold memory:
a row's pages stay after its cells are dropped, and a copy across streams writes every cell of
the destination, so a worker's memory ratcheted up until every stream was resident
(bench/worker_memory.py). KvPages hands such pages back (madvise MADV_DONTNEED: they read as zeros
again until written).

The layout is computed from the model's shapes and checked after the warm-up against llama.cpp's
own serialization of every row's cells: nothing is handed back unless every row's cells lie where
the layout says (`locate`)."""

from __future__ import annotations

import ctypes
import functools
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from workers.engine.config import EngineConfig
from workers.engine.pages import ARENA_MAX_BYTES, PAGE_BYTES, Region, drop_pages

#: ggml's alignment of the buffers it allocates (ggml_aligned_malloc): the first tensor starts at
#: the first multiple of it past glibc's chunk header.
_BUFFER_ALIGNMENT = 64
#: Bytes of one 8-bit K/V block (ggml's q8_0: an f16 scale and 32 int8 values) and its values.
_Q8_0_BLOCK_BYTES, _Q8_0_BLOCK_VALUES = 34, 32

logger = logging.getLogger(__name__)


def row_bytes(cell_type: str, values: int) -> int:
    """Bytes one cell of one layer's K (or V) takes: `values` numbers of `cell_type` ("q8_0", "f16";
    ggml_row_size)."""
    if cell_type == "q8_0":
        return values // _Q8_0_BLOCK_VALUES * _Q8_0_BLOCK_BYTES
    if cell_type == "f16":
        return 2 * values
    raise ValueError(f"unknown K/V cell type {cell_type!r}")


@dataclass(frozen=True, slots=True)
class StreamLayout:
    """Where llama.cpp keeps each row's cells: `tensors` tensors (K then V of each layer) one after
    the other from `base`, each holding `streams` slices of `cells` cells of `row_bytes` bytes."""

    base: int
    tensors: int
    streams: int
    cells: int
    row_bytes: int

    @property
    def size(self) -> int:
        return self.tensors * self.streams * self.cells * self.row_bytes

    def address(self, tensor: int, stream: int, cell: int) -> int:
        """Where cell `cell` of `stream` starts in tensor `tensor`."""
        return self.base + ((tensor * self.streams + stream) * self.cells + cell) * self.row_bytes

    def pages_past(self, stream: int, cell: int) -> list[Region]:
        """The whole pages that hold only cells of `stream` from `cell` on, in every tensor (a page
        shared with an earlier cell, or with the next stream, is not among them)."""
        regions = []
        for tensor in range(self.tensors):
            start = -(-self.address(tensor, stream, cell) // PAGE_BYTES) * PAGE_BYTES
            end = self.address(tensor, stream, self.cells) // PAGE_BYTES * PAGE_BYTES
            if start < end:
                regions.append(Region(start, end))
        return regions


def locate(
    chunks: Iterable[Region],
    shape: tuple[int, int, int, int],
    state: Callable[[int], bytes],
    held: Callable[[int], int],
) -> StreamLayout | None:
    """The layout of the KV streams among `chunks` (the large allocations the context made,
    pages.ZeroPageWatch), or None where it cannot be confirmed. `shape`: (tensors, streams, cells,
    row_bytes); `state(stream)`: llama.cpp's serialization of that stream's sequence; `held(stream)`:
    how many cells it holds, at least two in every stream, all written (the warm-up's).

    A candidate layout holds when, for every stream, each tensor's bytes of the stream's cells
    (K of every layer, then V: the serialization's order) are found in that serialization in order
    and are not all zeros."""
    tensors, streams, cells, cell_bytes = shape
    size = tensors * streams * cells * cell_bytes
    for chunk in sorted(chunks, key=lambda chunk: chunk.size):
        first = chunk.start - chunk.start % _BUFFER_ALIGNMENT + _BUFFER_ALIGNMENT  # past the header
        for base in range(first, min(chunk.start + PAGE_BYTES, chunk.end - size + 1), _BUFFER_ALIGNMENT):
            layout = StreamLayout(base, tensors, streams, cells, cell_bytes)
            if in_place(layout, state, held, streams=(0,)) and in_place(layout, state, held, range(streams)):
                return layout
    return None


def in_place(
    layout: StreamLayout, state: Callable[[int], bytes], held: Callable[[int], int], streams: Iterable[int]
) -> bool:
    """Whether each of `streams` holds at least two cells and their bytes, K of every layer then V,
    are where `layout` says: found, in order, in llama.cpp's serialization of its sequence, and not
    all zeros (so cell i holds position i, as the layout's handing back assumes)."""
    for stream in streams:
        serialized, count = state(stream), held(stream)
        if count < 2:
            return False
        found = 0
        # K of every layer (even tensors), then V (odd ones), as llama.cpp writes them.
        order = [*range(0, layout.tensors, 2), *range(1, layout.tensors, 2)]
        for tensor in order:
            cells = ctypes.string_at(layout.address(tensor, stream, 0), count * layout.row_bytes)
            found = serialized.find(cells, found) if any(cells) else -1
            if found < 0:
                return False
            found += len(cells)
    return True


class KvPages:
    """Which pages of each stream may hold cells written since they were last handed back, and
    their handing back (see the module docstring). Called from the engine's thread only, between
    llama.cpp calls (no llama.cpp thread runs then)."""

    def __init__(self, layout: StreamLayout) -> None:
        self.layout = layout
        #: Per stream: the cells past which nothing was written since its pages were last handed back.
        self._written = [layout.cells] * layout.streams
        #: Resident bytes handed back so far.
        self.released = 0

    def wrote(self, stream: int, cells: int) -> None:
        """`stream`'s cells 0 .. cells-1 may have been written."""
        self._written[stream] = max(self._written[stream], cells)

    def trim(self, stream: int, held: int) -> None:
        """`stream` now holds cells 0 .. held-1 only: hand back the pages past them."""
        if self._written[stream] > held:
            self.released += sum(map(drop_pages, self.layout.pages_past(stream, held)))
            self._written[stream] = held


class KvStreams:
    """One llama.cpp context's KV streams where the executor goes past llama.cpp's memory API: a
    row's cells copied into another row (only the cells held), and, once the layout is confirmed
    (`locate`), the pages past each row's cells handed back. Called from the engine's thread only."""

    def __init__(self, llama: Any, context: Any) -> None:
        self._llama, self._context = llama, context
        self._memory = llama.llama_get_memory(context)
        # _serialize's buffer, kept (a fresh one costs a page fault per page): as large as the most
        # cells a row copied held, 25 MB at 2048 cells of the default model.
        self._state: ctypes.Array[ctypes.c_uint8] = (ctypes.c_uint8 * 0)()
        #: The streams' pages; None while the layout is not confirmed (nothing is handed back).
        self.pages: KvPages | None = None

    def cells(self, row: int) -> int:
        """KV cells `row` holds (0 when empty): its highest position + 1."""
        return int(self._llama.llama_memory_seq_pos_max(self._memory, row)) + 1

    def locate(self, model: Any, config: EngineConfig, chunks: Iterable[Region]) -> None:
        """Confirm the streams' layout (module `locate`) among `chunks`, the context's large
        allocations, while every row holds at least two written cells (the warm-up's). Streams no
        larger than a malloc arena are not a mapping of their own and are left alone; a layout that
        does not hold is logged, and nothing is handed back."""
        llama = self._llama
        layers, heads_kv = llama.llama_model_n_layer(model), llama.llama_model_n_head_kv(model)
        values = llama.llama_model_n_embd(model) // llama.llama_model_n_head(model) * heads_kv
        cells = config.llamacpp_sequence_tokens
        shape = (2 * layers, config.max_batch_size, cells, row_bytes(config.llamacpp_kv_cells, values))
        if math.prod(shape) <= ARENA_MAX_BYTES:
            return
        layout = locate(chunks, shape, functools.cache(self.serialized), self.cells)
        if layout is None:
            logger.warning("the KV streams' layout is not llama.cpp's known one: their pages stay resident")
        self.pages = KvPages(layout) if layout is not None else None

    def copy(self, source: int, target: int) -> None:
        """Give the free `target` a copy of `source`'s cells, at the same positions, through
        llama.cpp's sequence state (llama_state_seq_get_data, then set_data, which empties `target`
        and fills it from its first cell): only the cells held are copied, where
        llama_memory_seq_cp across streams copies every cell of the stream (25 MB for the default
        model at 2048 cells) and so writes every page of the target."""
        written = self._serialize(source)
        if not written or not self._llama.llama_state_seq_set_data(
            self._context, self._state, written, target
        ):
            raise RuntimeError(f"llama.cpp could not copy seq_id {source}'s cells to {target}")
        held = self.cells(target)
        self.wrote(target, held)  # so that dropping some of them later hands their pages back
        self.trim(target, held)  # what the target held before, past the copy

    def serialized(self, row: int) -> bytes:
        """llama.cpp's serialization of `row`'s sequence, a copy."""
        written = self._serialize(row)
        return ctypes.string_at(self._state, written)

    def wrote(self, row: int, cells: int) -> None:
        """`row`'s cells 0 .. cells-1 may have been written (KvPages.wrote)."""
        if self.pages is not None:
            self.pages.wrote(row, cells)

    def trim(self, row: int, held: int) -> None:
        """`row` now holds cells 0 .. held-1 only: hand back the pages past them (KvPages.trim)."""
        if self.pages is not None:
            self.pages.trim(row, held)

    def _serialize(self, row: int) -> int:
        """Serialize `row`'s sequence into self._state (llama_state_seq_get_data); the bytes written."""
        size = int(self._llama.llama_state_seq_get_size(self._context, row))
        if len(self._state) < size:
            self._state = (ctypes.c_uint8 * size)()
        return int(self._llama.llama_state_seq_get_data(self._context, self._state, size, row))
