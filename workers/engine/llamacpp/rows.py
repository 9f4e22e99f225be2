"""Which llama.cpp seq_id each running sequence holds, and the prefix cache: a free seq_id may still
hold the KV cells of the sequence that last ran there, and a new prompt that starts with the same
tokens reuses them and skips their prefill (as llama-server's per-slot prompt cache). Cells are kept
where they are when that is cheap: a prompt whose prefix lies in a seq_id whose other cells it
would overwrite (or, with a stream per row, away from the run) gets a copy of those cells in an
empty seq_id, so the cells stay for a later prompt, as llama-server saves a slot's cells before
reusing the slot. The cells free seq_ids keep are bounded (`evict`): past the bound, those given
back longest ago are dropped first, as an LRU cache would.

With a stream per row (context.py's batch-invariant layout), llama.cpp runs a batch as one
forward pass per run of consecutive seq_ids, so rows out of order decode much more slowly: the
running seq_ids are then kept one run (`one_run`), and when a gap opens the fewest sequences move
into it (`packing`)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """A prefix-cache lookup's answer for a new sequence: the seq_id it runs in, and how many of its
    prompt's leading tokens that seq_id's KV cells hold once `copy_from` is copied there (positions
    0 .. cached_tokens - 1; its cells from cached_tokens on are to be dropped)."""

    row: int
    cached_tokens: int = 0
    #: A free seq_id whose cells are to be copied into `row` first (the prefix among them); it
    #: keeps its cells for a later prompt. None: `row`'s own cells hold the prefix.
    copy_from: int | None = None


#: Tokens a copy of a row's cells (or a move) must save, or keep from being overwritten, to be made:
#: a copy costs up to a few prefilled tokens' worth, so a margin keeps copies for real savings.
MOVE_WORTH_TOKENS = 8


class SeqIds:
    """The free seq_ids of one context of `count` rows, and the tokens each free one's KV cells
    still hold; the caller holds the used ones. `one_run`: keep the used seq_ids one run of
    consecutive ones (a stream per row)."""

    def __init__(self, count: int, one_run: bool = True) -> None:
        self._count = count
        self._one_run = one_run
        self._free = set(range(count))
        # free seq_id -> its cells' tokens (positions 0..n-1), the least recently used first
        self._held: dict[int, list[int]] = {}

    def take(self, used: Collection[int], prompt: Sequence[int] = ()) -> PrefixMatch:
        """A seq_id for a new sequence, and where its prompt's cached prefix comes from.

        The prefix: the free seq_id whose cells hold the longest prefix of `prompt` (at most all but
        its last token, whose logits the prefill must compute) among the candidates (any free one,
        or with `one_run` one that keeps the running ones one run: any free one when none runs, else
        one right after or before the run, or inside it: a gap); on a tie, one holding no cells,
        then after the run, then before it, then the lowest. A free seq_id elsewhere holding more
        than MOVE_WORTH_TOKENS tokens more wins.

        The seq_id: that one, unless an empty candidate exists and the prefix's seq_id is no
        candidate or holds more than MOVE_WORTH_TOKENS cells past the prefix: then the empty one,
        with a copy of the prefix's cells (PrefixMatch.copy_from), which keep their place. With no
        empty one, a seq_id away from the run is taken itself (packing() then moves one
        sequence). An empty `prompt` reuses nothing."""
        kept = {row: _common_prefix(self._held.get(row, ()), prompt, len(prompt) - 1) for row in self._free}
        candidates = self._candidates(used)
        row = max(candidates, key=lambda row: (kept[row], row not in self._held, candidates[row]))
        farther = max(self._free, key=lambda row: (kept[row], -row))
        if kept[farther] > kept[row] + MOVE_WORTH_TOKENS:
            row = farther
        empty = [candidate for candidate in candidates if candidate not in self._held]
        overwritten = len(self._held.get(row, ())) - kept[row]
        if (
            empty
            and kept[row] > MOVE_WORTH_TOKENS
            and (row not in candidates or overwritten > MOVE_WORTH_TOKENS)
        ):
            target = max(empty, key=candidates.__getitem__)
            self._free.remove(target)
            self._held[row] = self._held.pop(row)  # used just now: the last to be evicted
            return PrefixMatch(target, kept[row], copy_from=row)
        self._free.remove(row)
        self._held.pop(row, None)
        return PrefixMatch(row, kept[row])

    def give_back(self, row: int, held: Sequence[int] = ()) -> None:
        """Free `row`; `held`: the tokens its KV cells keep (positions 0 .. len(held) - 1), if any."""
        self._free.add(row)
        self._held.pop(row, None)
        if held:
            self._held[row] = list(held)

    def evict(self, most_tokens: int) -> list[int]:
        """Forget the cells of the free seq_ids given back longest ago until those kept hold at most
        `most_tokens` tokens; the seq_ids whose cells are to be dropped (their streams are empty to
        the next take)."""
        evicted = []
        kept = self.held_tokens
        while kept > most_tokens:
            row, tokens = next(iter(self._held.items()))
            del self._held[row]
            kept -= len(tokens)
            evicted.append(row)
        return evicted

    @property
    def held_tokens(self) -> int:
        """KV cells the free seq_ids keep for later prompts."""
        return sum(map(len, self._held.values()))

    def packing(self, used: Collection[int]) -> Iterator[tuple[int, int]]:
        """The moves (from, to) that make `used` one run, as few as can be: of the windows of
        len(used) consecutive seq_ids, the one already holding the most of them (the lowest on a
        tie) takes the others, highest first, into its free seq_ids, lowest first (whose kept
        cells they overwrite). Each is booked as it is yielded. None without `one_run`."""
        rows = set(used)
        if not self._one_run or not rows or max(rows) - min(rows) + 1 == len(rows):
            return
        size = len(rows)
        start = max(
            range(self._count - size + 1), key=lambda at: (len(rows & set(range(at, at + size))), -at)
        )
        window = range(start, start + size)
        outside = sorted((row for row in rows if row not in window), reverse=True)
        gaps = sorted(row for row in window if row not in rows)
        for moved, gap in zip(outside, gaps, strict=True):
            self._free.remove(gap)
            self._held.pop(gap, None)
            self._free.add(moved)
            yield moved, gap

    def _candidates(self, used: Collection[int]) -> dict[int, int]:
        """The free seq_ids a new sequence may take without a move, each with its rank among equal
        prefixes (the lowest first where any will do)."""
        if not used or not self._one_run:
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
