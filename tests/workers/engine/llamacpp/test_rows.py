"""SeqIds keeps a llama.cpp context's running seq_ids one run (the executor's tests run it on the model)."""

from __future__ import annotations

from workers.engine.llamacpp.rows import PrefixMatch, SeqIds


def test_new_sequences_extend_the_run_after_it_then_before_it() -> None:
    seq_ids = SeqIds(4)
    assert [seq_ids.take(used).row for used in ([], [0], [0, 1])] == [0, 1, 2]
    seq_ids.give_back(0)
    assert seq_ids.take([1, 2]).row == 3  # after the run
    assert seq_ids.take([1, 2, 3]).row == 0  # then before it


def test_packing_makes_one_run_with_the_fewest_moves() -> None:
    seq_ids = SeqIds(6)
    for used in ([], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]):
        seq_ids.take(used)
    seq_ids.give_back(1)
    seq_ids.give_back(2)
    # [2, 5] already holds three of 0, 3, 4, 5: only 0 moves (filling 1 and 2 from above took two).
    assert list(seq_ids.packing([0, 3, 4, 5])) == [(0, 2)]
    assert list(seq_ids.packing([2, 3, 4, 5])) == []
    assert seq_ids.take([2, 3, 4, 5]).row == 1  # before the run; the moved-from 0 is free again
    assert seq_ids.take([1, 2, 3, 4, 5]).row == 0
    assert list(SeqIds(6).packing([2, 3])) == []  # a run need not start at 0
    # No window holds more than one of 0 and 3: the lowest takes the other, highest first.
    assert list(SeqIds(6).packing([3, 0])) == [(3, 1)]


def test_a_new_prompt_takes_the_free_seq_id_holding_its_longest_prefix() -> None:
    seq_ids = SeqIds(4)
    for used in ([], [0], [0, 1]):
        seq_ids.take(used)
    seq_ids.give_back(0, [7, 8, 9, 1])
    seq_ids.give_back(1, [7, 8, 2])
    seq_ids.give_back(2, [7, 8, 9, 3, 4])
    assert seq_ids.held_tokens == 12
    # None runs: any free seq_id; the longest shared prefix wins, at most all but the last token.
    assert seq_ids.take([], [7, 8, 9, 3, 5]) == PrefixMatch(2, 4)
    assert seq_ids.take([2], [7, 8, 2]) == PrefixMatch(1, 2)  # all of it held: its last token is run again
    assert seq_ids.held_tokens == 4
    assert seq_ids.take([1, 2], [5, 6]) == PrefixMatch(3)  # nothing shared: after the run, as before
    assert seq_ids.take([1, 2, 3], [7, 8, 9, 1, 5]) == PrefixMatch(0, 4)  # before the run, and shared


def test_reuse_never_breaks_the_run_and_overwritten_cells_are_forgotten() -> None:
    seq_ids = SeqIds(5)
    for used in ([], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3]):
        seq_ids.take(used)
    seq_ids.give_back(0, [1, 2, 3])
    seq_ids.give_back(2, [1, 2, 4])
    # 0 holds the longer prefix but lies outside the run [3, 3]; 2 (next to it) is taken.
    assert seq_ids.take([3], [1, 2, 3, 9]) == PrefixMatch(2, 2)
    seq_ids.give_back(1, [1, 2, 3, 9])
    assert list(seq_ids.packing([2, 4, 3, 0])) == [(4, 1)]  # 1's cells are overwritten by 4's
    assert seq_ids.take([0, 1, 2, 3], [1, 2, 3, 9, 9]) == PrefixMatch(4)  # 4's cells moved out: nothing held
    seq_ids.give_back(4, [1, 2])
    assert seq_ids.held_tokens == 3 + 2  # 0 keeps its three; 4 holds what it was given back with
    assert seq_ids.take([0, 1, 2, 3], [1, 2, 3]) == PrefixMatch(4, 2)


def _running(count: int, rows: int) -> SeqIds:
    seq_ids = SeqIds(count)
    for row in range(rows):
        assert seq_ids.take(list(range(row))).row == row
    return seq_ids


#: A chat template's opening, which every seq_id that ran a chat holds.
TEMPLATE = list(range(100, 120))


def test_cells_away_from_the_run_are_copied_into_an_empty_seq_id_beside_it() -> None:
    seq_ids = _running(8, 4)  # 0-3 ran; 3 keeps running
    seq_ids.give_back(1)
    seq_ids.give_back(0, [*TEMPLATE, *range(2, 14)])  # the same conversation, 12 tokens further
    seq_ids.give_back(2, [*TEMPLATE, 1])  # beside the run: the template only
    taken = seq_ids.take([3], [*TEMPLATE, *range(2, 15)])
    # 12 > 8 more than beside the run: worth a copy, into 4 (empty; 2 keeps its cells too).
    assert taken == PrefixMatch(4, len(TEMPLATE) + 12, copy_from=0)
    assert list(seq_ids.packing([3, 4])) == []
    assert seq_ids.held_tokens == (len(TEMPLATE) + 12) + (len(TEMPLATE) + 1)  # 0's cells stay


def test_with_no_empty_seq_id_beside_the_run_the_far_one_is_taken_and_one_move_rejoins() -> None:
    seq_ids = _running(5, 5)  # 0-4 ran; 3 keeps running
    seq_ids.give_back(1)
    seq_ids.give_back(0, [*TEMPLATE, *range(2, 14)])
    seq_ids.give_back(2, [*TEMPLATE, 1])
    seq_ids.give_back(4, [7])
    assert seq_ids.take([3], [*TEMPLATE, *range(2, 15)]) == PrefixMatch(0, len(TEMPLATE) + 12)
    assert list(seq_ids.packing([3, 0])) == [(3, 1)]  # one move puts the run back together


def test_a_prompt_sharing_only_the_template_copies_it_and_leaves_the_conversation() -> None:
    seq_ids = _running(4, 1)
    conversation = [*TEMPLATE, *range(1, 11)]
    seq_ids.give_back(0, conversation)
    # Reusing 0 would overwrite 10 of its cells: its stream is copied into an empty seq_id.
    assert seq_ids.take([], [*TEMPLATE, 50, 51]) == PrefixMatch(1, len(TEMPLATE), copy_from=0)
    # The conversation's next turn overwrites nothing of 0: 0 itself.
    assert seq_ids.take([1], [*conversation, 11, 12]) == PrefixMatch(0, len(conversation))


def test_a_seq_id_away_from_the_run_is_not_taken_for_a_few_tokens() -> None:
    seq_ids = _running(8, 4)
    seq_ids.give_back(1)
    seq_ids.give_back(0, [*TEMPLATE, *range(2, 10)])  # 8 tokens further only
    seq_ids.give_back(2, [*TEMPLATE, 1])
    assert seq_ids.take([3], [*TEMPLATE, *range(2, 15)]) == PrefixMatch(2, len(TEMPLATE))


def test_on_a_tie_a_seq_id_holding_nothing_is_taken_before_one_keeping_cells() -> None:
    seq_ids = _running(4, 2)
    seq_ids.give_back(0, [*TEMPLATE, 1])
    seq_ids.give_back(1)
    assert seq_ids.take([], [5, 6, 7]) == PrefixMatch(1)  # nothing shared anywhere: 0 keeps its cells
    assert seq_ids.take([1], [5, 6, 7]) == PrefixMatch(2)  # beside the run, holding nothing: not 0


def test_the_cells_given_back_longest_ago_are_evicted_first_past_the_bound() -> None:
    seq_ids = SeqIds(4)
    for used in ([], [0], [0, 1], [0, 1, 2]):
        seq_ids.take(used)
    seq_ids.give_back(2, [1, 2, 3])
    seq_ids.give_back(0, [4, 5, 6, 7])
    seq_ids.give_back(1, [8, 9])
    assert seq_ids.evict(9) == []  # 3 + 4 + 2 tokens kept: within the bound
    assert seq_ids.evict(6) == [2]  # the oldest goes first, and only as many as the bound needs
    assert seq_ids.held_tokens == 6
    assert seq_ids.take([3], [1, 2, 3, 4]) == PrefixMatch(2, 0)  # 2's cells are forgotten ...
    assert seq_ids.evict(0) == [0, 1]
    assert seq_ids.take([2, 3], [4, 5, 6, 7, 1]).cached_tokens == 0  # ... and so are 0's


def test_a_seq_id_given_back_again_or_copied_from_is_the_last_to_be_evicted() -> None:
    template = list(range(100, 120))
    seq_ids = SeqIds(4)
    for used in ([], [0], [0, 1], [0, 1, 2]):
        seq_ids.take(used)
    seq_ids.give_back(0, [*template, 1])
    seq_ids.give_back(1, [*template, 2, 2])
    seq_ids.give_back(2, [5, 5])
    seq_ids.give_back(0, [*template, 3])  # 0 again: now the most recent
    assert seq_ids.evict(len(template) + 1) == [1, 2]
    seq_ids.give_back(1, [6])
    # 0's prefix is copied into an empty seq_id beside the run (3 runs): 0 keeps its cells, and was
    # used just now, so 1 goes first.
    taken = seq_ids.take([3], [*template, 9, 9])
    assert (taken.copy_from, taken.cached_tokens) == (0, len(template))
    assert seq_ids.evict(len(template) + 1) == [1]


def test_without_one_run_any_free_seq_id_will_do_and_nothing_moves() -> None:
    """The shared KV cache (workers/engine/llamacpp/context.py) runs any seq_ids in one forward
    pass: a new sequence takes the lowest free one, or the one holding its prefix wherever it lies,
    and packing moves nothing."""
    seq_ids = SeqIds(6, one_run=False)
    for used in ([], [0], [0, 1], [0, 1, 2]):
        seq_ids.take(used)
    seq_ids.give_back(1, [*TEMPLATE, 5])
    seq_ids.give_back(2)
    assert list(seq_ids.packing([0, 3])) == []
    assert seq_ids.take([0, 3], [9, 9]) == PrefixMatch(2)  # nothing shared: the lowest empty one
    assert seq_ids.take([0, 2, 3], [*TEMPLATE, 7]) == PrefixMatch(1, len(TEMPLATE))  # away, no matter
