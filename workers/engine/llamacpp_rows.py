"""Which llama.cpp seq_id each running sequence holds: the running ones kept one run of consecutive
seq_ids, because with one KV stream per seq_id llama.cpp runs a batch as one forward pass per such
run (llamacpp_executor.py's module docstring has the measurement). A free seq_id may still hold the
KV cells of the sequence that last ran there: a new prompt that starts with the same tokens takes
that seq_id and skips their prefill (the prefix cache, as llama-server's per-slot prompt cache)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Taken:
    """A seq_id given to a new sequence, and how many of its prompt's leading tokens the seq_id's
    KV cells already hold (positions 0 .. kept - 1; the cells from `kept` on are to be dropped)."""

    row: int
    kept: int = 0


class SeqIds:
    """The free seq_ids of one context of `count` rows, and the tokens each free one's KV cells
    still hold; the caller holds the used ones."""

    def __init__(self, count: int) -> None:
        self._free = set(range(count))
        self._held: dict[int, list[int]] = {}  # free seq_id -> its cells' tokens, positions 0..n-1

    def take(self, used: Collection[int], prompt: Sequence[int] = ()) -> Taken:
        """A free seq_id for a new sequence, which keeps the running ones one run (after packing): any
        free one when none runs, else one right after or before the run, or inside it (a gap). Of
        those, the one whose cells hold the longest prefix of `prompt` (at most all but its last
        token, whose logits the prefill must compute); on a tie, after the run, then before it, then
        the lowest. An empty `prompt` reuses nothing."""
        candidates = self._candidates(used)
        kept = {row: _common_prefix(self._held.get(row, ()), prompt, len(prompt) - 1) for row in candidates}
        row = max(candidates, key=lambda row: (kept[row], candidates[row]))
        self._free.remove(row)
        self._held.pop(row, None)
        return Taken(row, kept[row])

    def give_back(self, row: int, held: Sequence[int] = ()) -> None:
        """Free `row`; `held`: the tokens its KV cells keep (positions 0 .. len(held) - 1), if any."""
        self._free.add(row)
        if held:
            self._held[row] = list(held)

    @property
    def held_tokens(self) -> int:
        """KV cells the free seq_ids keep for later prompts."""
        return sum(map(len, self._held.values()))

    def packing(self, used: Collection[int]) -> Iterator[tuple[int, int]]:
        """The moves (from, to) that make `used` one run: while a free seq_id lies inside it, the
        highest moves into the lowest such one (whose kept cells it overwrites). Each is booked as
        it is yielded."""
        rows = set(used)
        while rows and max(rows) - min(rows) + 1 != len(rows):
            low, high = min(rows), max(rows)
            gap = min(row for row in self._free if low < row < high)
            self._free.remove(gap)
            self._held.pop(gap, None)
            self._free.add(high)
            rows.remove(high)
            rows.add(gap)
            yield high, gap

    def _candidates(self, used: Collection[int]) -> dict[int, int]:
        """The free seq_ids a new sequence may take, each with its rank among equal prefixes."""
        if not used:
            return {row: -row for row in self._free}
        low, high = min(used), max(used)
        ranked = {row: -row for row in self._free if low < row < high}
        for rank, row in ((1, low - 1), (2, high + 1)):
            if row in self._free:
                ranked[row] = len(self._free) + rank
        return ranked or {row: -row for row in self._free}


def _common_prefix(held: Sequence[int], prompt: Sequence[int], most: int) -> int:
    count = 0
    for mine, theirs in zip(held, prompt[: max(most, 0)], strict=False):
        if mine != theirs:
            break
        count += 1
    return count
