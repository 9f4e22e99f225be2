"""A batched KV cache for continuous batching over a plain transformers forward pass.

Each layer holds one preallocated buffer per K and V, shaped [rows, kv_heads, columns, head_dim].
Row i is one running sequence; all rows are right-aligned at column `cur` (the next write), so row i's
tokens sit in columns [cur - length_i, cur) and everything left of that is padding the mask hides.
A decode step writes one column for every row in place and attends over the window
[cur - longest, cur]: no per-step concatenation (DynamicCache copies the whole cache every step).

Sequences join with the K/V of their own prefill (run alone, so their prompt is computed exactly as
a solo run would) and leave by moving the last row into their place: rows stay dense, so a step
costs the live batch only. When the window reaches the right edge, or a new prompt does not fit
left of `cur`, the window is moved (and the buffers grown) once; both are rare.

Memory follows the live batch, not the limits: buffers hold as many rows as have been live since
the batch was last empty (grown by doubling up to max_rows), and the first sequence to join an
empty batch replaces them with one-row buffers (not the leaving row: remove() stays as cheap as it
was on the step that finishes a request). Allocating max_rows rows up front, and keeping the
columns an earlier burst had grown, held the memory of the largest batch ever seen for good.

It subclasses `Cache` so models accept it as `past_key_values`; the engine passes a ready 4D mask
and explicit position ids, so transformers' own mask and position logic never asks it for sizes.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Cache, DynamicCache
from transformers.cache_utils import CacheLayerMixin

#: Columns added beyond the need when buffers grow: bounds how often the window moves.
_MIN_HEADROOM = 64
_MAX_HEADROOM = 1024


class _SlotLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """A shell per layer so `Cache`'s per-layer bookkeeping works; the data lives in SlotKVCache."""

    is_sliding = False

    def __init__(self, owner: SlotKVCache) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError("SlotKVCache.update writes all layers")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._owner.window + query_length, 0

    def get_seq_length(self) -> int:
        return self._owner.window

    def get_max_length(self) -> int:
        return -1


class SlotKVCache(Cache):
    """Dense rows of right-aligned sequences; see the module docstring."""

    def __init__(self, num_layers: int, max_rows: int) -> None:
        super().__init__(layers=[_SlotLayer(self) for _ in range(num_layers)])
        self.max_rows = max_rows
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._lengths: list[int] = []
        self._cur = 0
        self._window_start = 0
        #: Longest prompt seen: room kept left of `cur` when the window moves, so the next prompt fits.
        self._prompt_hint = 0

    @property
    def rows(self) -> int:
        return len(self._lengths)

    @property
    def window(self) -> int:
        """Columns the longest sequence spans (the attention span of a decode step, minus the new token)."""
        return max(self._lengths, default=0)

    @property
    def lengths(self) -> list[int]:
        return list(self._lengths)

    @property
    def reserved_bytes(self) -> int:
        """Bytes the K/V buffers take now (an empty batch keeps its last buffers until one joins)."""
        return sum(buffer.nbytes for buffer in (*self._keys, *self._values))

    def append(self, prefill: DynamicCache) -> int:
        """Add a sequence from its prefill cache (batch 1); returns its row."""
        first, _ = layer_kv(prefill, 0)
        length = first.shape[-2]
        if self.rows >= self.max_rows:
            raise RuntimeError(f"SlotKVCache is full ({self.max_rows} rows)")
        if not self._lengths:  # a new burst: drop the last one's buffers before allocating
            self._keys, self._values = [], []
            self._allocate(first, rows=1, columns=length + _headroom(length))
            self._cur = length
        self._prompt_hint = max(self._prompt_hint, length)
        self._make_room(left=length)
        row, span = self.rows, slice(self._cur - length, self._cur)
        if row >= self._keys[0].shape[0]:
            self._add_rows(min(self.max_rows, 2 * row))
        for layer, (keys, values) in enumerate(zip(self._keys, self._values, strict=True)):
            source_keys, source_values = layer_kv(prefill, layer)
            keys[row, :, span] = source_keys[0]
            values[row, :, span] = source_values[0]
        self._lengths.append(length)
        return row

    def remove(self, row: int) -> int | None:
        """Drop a row; the last row moves into its place. Returns the row that moved, if any."""
        last = self.rows - 1
        moved: int | None = None
        if row != last:
            span = slice(self._cur - self._lengths[last], self._cur)
            for keys, values in zip(self._keys, self._values, strict=True):
                keys[row, :, span] = keys[last, :, span]
                values[row, :, span] = values[last, :, span]
            self._lengths[row] = self._lengths[last]
            moved = last
        self._lengths.pop()
        return moved

    def begin_decode(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids [rows, 1] and the 4D bool mask [rows, 1, 1, window + 1] of the next decode step."""
        self._make_room(left=0)
        window = self.window
        self._window_start = self._cur - window
        device = self._keys[0].device
        lengths = torch.tensor(self._lengths, device=device)
        columns = torch.arange(window + 1, device=device)
        mask = columns[None, :] >= (window - lengths)[:, None]
        return lengths[:, None], mask[:, None, None, :]

    def end_decode(self) -> None:
        self._cur += 1
        self._lengths = [length + 1 for length in self._lengths]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's K/V (one token per row) and return the window's K/V (views, no copy)."""
        if key_states.shape[-2] != 1:
            raise ValueError("SlotKVCache takes decode steps only (prefill runs on a DynamicCache)")
        rows, cur = self.rows, self._cur
        keys, values = self._keys[layer_idx], self._values[layer_idx]
        keys[:rows, :, cur : cur + 1] = key_states
        values[:rows, :, cur : cur + 1] = value_states
        return keys[:rows, :, self._window_start : cur + 1], values[:rows, :, self._window_start : cur + 1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.window

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.window + query_length, 0

    def _allocate(self, like: torch.Tensor, rows: int, columns: int) -> None:
        _, heads, _, head_dim = like.shape
        shape = (rows, heads, columns, head_dim)
        # Zeros, not empty: masked columns still enter the attention product (times a zero weight),
        # and uninitialized memory can hold NaN, which a zero weight does not cancel.
        self._keys = [torch.zeros(shape, dtype=like.dtype, device=like.device) for _ in self.layers]
        self._values = [torch.zeros(shape, dtype=like.dtype, device=like.device) for _ in self.layers]

    def _add_rows(self, rows: int) -> None:
        """Grow every buffer to `rows` rows (zeros), keeping the live rows' columns."""
        for buffers in (self._keys, self._values):
            for index, old in enumerate(buffers):
                grown = old.new_zeros((rows, *old.shape[1:]))
                grown[: self.rows] = old[: self.rows]
                buffers[index] = grown

    def _make_room(self, left: int) -> None:
        """Ensure `left` free columns left of `cur` and one free column at `cur`."""
        columns = self._keys[0].shape[2]
        if left <= self._cur < columns:
            return
        new_cur = max(left, self.window, self._prompt_hint)
        self._move_window(new_cur, min_columns=new_cur + _headroom(new_cur))

    def _move_window(self, new_cur: int, min_columns: int) -> None:
        window, rows = self.window, self.rows
        source, target = slice(self._cur - window, self._cur), slice(new_cur - window, new_cur)
        columns = self._keys[0].shape[2]
        for index in range(len(self._keys)):
            for buffers in (self._keys, self._values):
                old = buffers[index]
                if min_columns > columns:
                    grown = old.new_zeros((*old.shape[:2], max(min_columns, 2 * columns), old.shape[3]))
                    grown[:rows, :, target] = old[:rows, :, source]
                    buffers[index] = grown
                else:
                    old[:rows, :, target] = old[:rows, :, source].clone()  # source and target may overlap
        self._cur = new_cur


def layer_kv(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = getattr(cache.layers[layer], "keys", None), getattr(cache.layers[layer], "values", None)
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise TypeError(
            f"prefill cache layer {layer} holds no key/value tensors (not a full-attention layer)"
        )
    return keys, values


def _headroom(columns: int) -> int:
    return max(_MIN_HEADROOM, min(columns, _MAX_HEADROOM))
