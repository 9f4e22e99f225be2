"""SeqIds keeps a llama.cpp context's running seq_ids one run (the executor's tests run it on the model)."""

from __future__ import annotations

from workers.engine.llamacpp_rows import SeqIds, Taken


def test_new_sequences_extend_the_run_after_it_then_before_it() -> None:
    seq_ids = SeqIds(4)
    assert [seq_ids.take(used).row for used in ([], [0], [0, 1])] == [0, 1, 2]
    seq_ids.give_back(0)
    assert seq_ids.take([1, 2]).row == 3  # after the run
    assert seq_ids.take([1, 2, 3]).row == 0  # then before it


def test_packing_moves_the_highest_into_the_gaps_inside_the_run_only() -> None:
    seq_ids = SeqIds(6)
    for used in ([], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3]):
        seq_ids.take(used)
    seq_ids.give_back(1)
    seq_ids.give_back(2)
    assert list(seq_ids.packing([0, 3, 4])) == [(4, 1), (3, 2)]
    assert list(seq_ids.packing([0, 1, 2])) == []
    assert seq_ids.take([0, 1, 2]).row == 3  # the moved-from seq_ids are free again
    assert list(SeqIds(6).packing([2, 3])) == []  # a run need not start at 0


def test_a_new_prompt_takes_the_free_seq_id_holding_its_longest_prefix() -> None:
    seq_ids = SeqIds(4)
    for used in ([], [0], [0, 1]):
        seq_ids.take(used)
    seq_ids.give_back(0, [7, 8, 9, 1])
    seq_ids.give_back(1, [7, 8, 2])
    seq_ids.give_back(2, [7, 8, 9, 3, 4])
    assert seq_ids.held_tokens == 12
    # None runs: any free seq_id; the longest shared prefix wins, at most all but the last token.
    assert seq_ids.take([], [7, 8, 9, 3, 5]) == Taken(2, 4)
    assert seq_ids.take([2], [7, 8, 2]) == Taken(1, 2)  # all of it held: its last token is run again
    assert seq_ids.held_tokens == 4
    assert seq_ids.take([1, 2], [5, 6]) == Taken(3)  # nothing shared: after the run, as before
    assert seq_ids.take([1, 2, 3], [7, 8, 9, 1, 5]) == Taken(0, 4)  # before the run, and shared


def test_reuse_never_breaks_the_run_and_overwritten_cells_are_forgotten() -> None:
    seq_ids = SeqIds(5)
    for used in ([], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3]):
        seq_ids.take(used)
    seq_ids.give_back(0, [1, 2, 3])
    seq_ids.give_back(2, [1, 2, 4])
    # 0 holds the longer prefix but lies outside the run [3, 3]; 2 (next to it) is taken.
    assert seq_ids.take([3], [1, 2, 3, 9]) == Taken(2, 2)
    seq_ids.give_back(1, [1, 2, 3, 9])
    assert list(seq_ids.packing([2, 4, 3, 0])) == [(4, 1)]  # 1's cells are overwritten by 4's
    assert seq_ids.take([0, 1, 2, 3], [1, 2, 3, 9, 9]) == Taken(4)  # 4's cells moved out: nothing held
    seq_ids.give_back(4, [1, 2])
    assert seq_ids.held_tokens == 3 + 2  # 0 keeps its three; 4 holds what it was given back with
    assert seq_ids.take([0, 1, 2, 3], [1, 2, 3]) == Taken(4, 2)
