"""SeqIds keeps a llama.cpp context's running seq_ids one run (the executor's tests run it on the model)."""

from __future__ import annotations

from workers.engine.llamacpp_rows import SeqIds


def test_new_sequences_extend_the_run_after_it_then_before_it() -> None:
    seq_ids = SeqIds(4)
    assert [seq_ids.take(used) for used in ([], [0], [0, 1])] == [0, 1, 2]
    seq_ids.give_back(0)
    assert seq_ids.take([1, 2]) == 3  # after the run
    assert seq_ids.take([1, 2, 3]) == 0  # then before it


def test_packing_moves_the_highest_into_the_gaps_inside_the_run_only() -> None:
    seq_ids = SeqIds(6)
    for used in ([], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3]):
        seq_ids.take(used)
    seq_ids.give_back(1)
    seq_ids.give_back(2)
    assert list(seq_ids.packing([0, 3, 4])) == [(4, 1), (3, 2)]
    assert list(seq_ids.packing([0, 1, 2])) == []
    assert seq_ids.take([0, 1, 2]) == 3  # the moved-from seq_ids are free again
    assert list(SeqIds(6).packing([2, 3])) == []  # a run need not start at 0
