"""The running batch as tensors: prefill one prompt, decode one step for every row. No policy here.

Prefill runs each prompt alone (batch 1, no padding) on a fresh DynamicCache, so its logits and K/V
are exactly those of a solo run; the K/V then join the SlotKVCache. A shared prefix (the chat
template's system block: ~20 of SmolLM2's ~40-token prompts) is computed once and its K/V copied
into each prefill that starts with it (prefix caching), which about halves prefill time here.
Decode steps run every row together with explicit position ids and a padding mask.

Rows are positions in SlotKVCache, and a member leaves by the last row moving into its place. The
batch is the one owner of which member (the engine's sequence) holds which row: callers name members,
never rows, so no list elsewhere has to mirror the swap.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

import torch
from transformers import DynamicCache, PreTrainedModel

from workers.engine.torch.kv_cache import SlotKVCache, layer_kv

Member = TypeVar("Member", bound=Hashable)


class RunningBatch(Generic[Member]):
    """The model and the KV cache of the members (sequences) being decoded, one row each."""

    def __init__(self, model: PreTrainedModel, max_rows: int) -> None:
        self._model = model
        self._device = next(model.parameters()).device
        layers = int(model.config.get_text_config().num_hidden_layers)
        self._cache = SlotKVCache(num_layers=layers, max_rows=max_rows)
        self._prefix: tuple[int, ...] = ()
        self._prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._members: list[Member] = []  # index == row
        self._rows: dict[Member, int] = {}

    @property
    def rows(self) -> int:
        return self._cache.rows

    @property
    def members(self) -> list[Member]:
        """The members in row order (a copy): decode() takes their last tokens in this order."""
        return list(self._members)

    def row(self, member: Member) -> int:
        return self._rows[member]

    def share_prefix(self, prefix_ids: list[int]) -> None:
        """Compute the K/V of a prefix many prompts start with, for prefill() to reuse."""
        self._prefix, self._prefix_kv = (), []
        if len(prefix_ids) < 2:
            return
        cache, _ = self.prefill(prefix_ids)
        self._prefix_kv = [layer_kv(cache, layer) for layer in range(len(cache.layers))]
        self._prefix = tuple(prefix_ids)

    def prefill(
        self, prompt_ids: list[int], every_position: bool = False
    ) -> tuple[DynamicCache, torch.Tensor]:
        """Run one prompt alone; returns its cache (to join()) and its logits [1, vocab] for the next
        token, or [prompt, vocab] for every position (row i predicts token i + 1) when every_position."""
        cache = DynamicCache()
        # The shared prefix's positions have no logits of their own: a prompt scored whole skips it.
        start = 0 if every_position else self._reuse_prefix(cache, prompt_ids)
        input_ids = torch.tensor([prompt_ids[start:]], device=self._device)
        position_ids = torch.arange(start, len(prompt_ids), device=self._device)[None]
        output = self._model(
            input_ids=input_ids,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=0 if every_position else 1,
        )
        logits: torch.Tensor = output.logits[0]
        return cache, logits

    def _reuse_prefix(self, cache: DynamicCache, prompt_ids: list[int]) -> int:
        """Seed `cache` with the shared prefix's K/V when the prompt starts with it; returns its length."""
        size = len(self._prefix)
        # At least one token must remain: its logits are the prefill's output.
        if not size or len(prompt_ids) <= size or tuple(prompt_ids[:size]) != self._prefix:
            return 0
        for layer, (keys, values) in enumerate(self._prefix_kv):
            cache.update(keys, values, layer)  # concatenates onto an empty layer: a copy, not an alias
        return size

    def join(self, member: Member, prefill: DynamicCache) -> int:
        """Add a prefilled member; returns its row."""
        if member in self._rows:
            raise ValueError(f"{member!r} already holds row {self._rows[member]}")
        row = self._cache.append(prefill)
        self._members.append(member)
        self._rows[member] = row
        return row

    def leave(self, member: Member) -> None:
        """Drop a member's row; the last row's member moves into it."""
        row = self._rows.pop(member)
        moved = self._cache.remove(row)
        last = self._members.pop()
        if moved is not None:
            self._members[row] = last
            self._rows[last] = row

    def warm_up(self, prompt_ids: list[int], steps: int) -> bool:
        """Fill every row with one prompt and decode `steps` tokens (the largest shape: buffers are
        allocated now, not by the first job), then empty the batch. Whether every logit was finite.
        Only while the batch has no members."""
        if self._members:
            raise RuntimeError("warm_up() on a batch with members")
        cache, logits = self.prefill(prompt_ids)
        for _ in range(self._cache.max_rows):
            self._cache.append(cache)
        tokens = [int(logits[-1].argmax())] * self._cache.max_rows
        finite = True
        for _ in range(steps):
            logits = self.decode(tokens)
            finite = finite and bool(torch.isfinite(logits).all())
            tokens = logits.argmax(dim=-1).tolist()
        while self._cache.rows:
            self._cache.remove(self._cache.rows - 1)
        return finite

    def decode(self, last_tokens: list[int]) -> torch.Tensor:
        """One step for every row: each row's last token, in members' order; returns logits [rows, vocab]."""
        position_ids, mask = self._cache.begin_decode()
        input_ids = torch.tensor(last_tokens, device=self._device)[:, None]
        output = self._model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask,
            past_key_values=self._cache,
            use_cache=True,
        )
        self._cache.end_decode()
        logits: torch.Tensor = output.logits[:, -1]
        return logits
