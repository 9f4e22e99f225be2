"""Which llama.cpp seq_id each running sequence holds: the running ones kept one run of consecutive
seq_ids, because with one KV stream per seq_id llama.cpp runs a batch as one forward pass per such
run (llamacpp_executor.py's module docstring has the measurement)."""

from __future__ import annotations

from collections.abc import Collection, Iterator


class SeqIds:
    """The free seq_ids of one context of `count` rows; the caller holds the used ones."""

    def __init__(self, count: int) -> None:
        self._free = set(range(count))

    def take(self, used: Collection[int]) -> int:
        """A free seq_id for a new sequence: right after the run of `used`, else right before it."""
        if used:
            for row in (max(used) + 1, min(used) - 1):
                if row in self._free:
                    self._free.remove(row)
                    return row
        row = min(self._free)
        self._free.remove(row)
        return row

    def give_back(self, row: int) -> None:
        self._free.add(row)

    def packing(self, used: Collection[int]) -> Iterator[tuple[int, int]]:
        """The moves (from, to) that make `used` one run: while a free seq_id lies inside it, the
        highest moves into the lowest such one. Each is booked as it is yielded."""
        rows = set(used)
        while rows and max(rows) - min(rows) + 1 != len(rows):
            low, high = min(rows), max(rows)
            gap = min(row for row in self._free if low < row < high)
            self._free.remove(gap)
            self._free.add(high)
            rows.remove(high)
            rows.add(gap)
            yield high, gap
