"""The Scheduler as a state machine: sequences in given states, schedule(), the plan and states after."""

from __future__ import annotations

import concurrent.futures
import time

from workers.engine.detokenizer import IncrementalText
from workers.engine.scheduler import Limits, Scheduler
from workers.engine.sequence import Sequence, SequenceStatus
from workers.engine.types import ErrorType, GenerationRequest, GenerationResult, SamplingParams

NOW = 1000.0


def _words(tokens: list[int], skip_special_tokens: bool) -> str:
    return " ".join(str(token) for token in tokens)


def _sequence(name: str, prompt: int = 4, reservation: int = 10, deadline: float | None = None) -> Sequence:
    request = GenerationRequest(name, SamplingParams(max_tokens=8), prompt="x", deadline=deadline)
    future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
    return Sequence(
        request=request,
        future=future,
        prompt_ids=list(range(prompt)),
        reservation=reservation,
        generator=None,
        submitted_at=time.monotonic(),
        text=IncrementalText(_words),
    )


def _scheduler(rows: int = 4, tokens: int = 1000, prefill: int = 1000) -> Scheduler:
    return Scheduler(
        Limits(max_batch_size=rows, max_batch_tokens=tokens, max_prefill_tokens_per_step=prefill)
    )


def _names(sequences: tuple[Sequence, ...]) -> list[str]:
    return [sequence.request_id for sequence in sequences]


def test_admits_in_order_up_to_the_batch_size_then_decodes_them() -> None:
    scheduler = _scheduler(rows=2)
    sequences = [_sequence(name) for name in "abc"]
    for sequence in sequences:
        scheduler.add(sequence)
    plan = scheduler.schedule(NOW)
    assert _names(plan.prefill) == ["a", "b"] and plan.decode == () and plan.aborts == ()
    assert [s.status for s in sequences] == [SequenceStatus.RUNNING] * 2 + [SequenceStatus.WAITING]
    assert sequences[0].admitted_at == NOW and sequences[0].future.running()
    plan = scheduler.schedule(NOW + 1)
    assert _names(plan.decode) == ["a", "b"] and plan.prefill == ()
    assert (scheduler.running, scheduler.waiting) == (2, 1)


def test_a_finished_sequence_frees_its_place_at_the_next_plan() -> None:
    scheduler = _scheduler(rows=1)
    first, second = _sequence("a"), _sequence("b")
    scheduler.add(first)
    scheduler.add(second)
    assert _names(scheduler.schedule(NOW).prefill) == ["a"]
    first.status = SequenceStatus.FINISHED_LENGTH  # what the OutputProcessor does when it ends
    plan = scheduler.schedule(NOW)
    assert _names(plan.prefill) == ["b"] and plan.decode == ()


def test_reservations_share_the_token_budget_and_an_oversized_one_runs_alone() -> None:
    scheduler = _scheduler(tokens=100)
    big, small, huge = (
        _sequence("big", reservation=80),
        _sequence("small", reservation=30),
        _sequence("huge", reservation=500),
    )
    for sequence in (big, small, huge):
        scheduler.add(sequence)
    assert _names(scheduler.schedule(NOW).prefill) == ["big"]  # 80 + 30 > 100: small waits (FIFO)
    big.status = SequenceStatus.FINISHED_STOPPED
    assert _names(scheduler.schedule(NOW).prefill) == ["small"]  # huge waits behind small
    small.status = SequenceStatus.FINISHED_STOPPED
    assert _names(scheduler.schedule(NOW).prefill) == ["huge"]  # alone, rather than never


def test_prefill_tokens_per_step_are_bounded_but_one_prompt_always_runs() -> None:
    scheduler = _scheduler(prefill=10)
    for name, prompt in (("long", 50), ("a", 6), ("b", 6)):
        scheduler.add(_sequence(name, prompt=prompt))
    assert _names(scheduler.schedule(NOW).prefill) == ["long"]
    assert _names(scheduler.schedule(NOW).prefill) == ["a"]  # 6 + 6 > 10
    assert _names(scheduler.schedule(NOW).prefill) == ["b"]


def test_cancelled_and_late_sequences_are_aborted_waiting_or_running() -> None:
    scheduler = _scheduler(rows=1)
    running, waiting = _sequence("running", deadline=NOW + 5), _sequence("waiting")
    scheduler.add(running)
    scheduler.add(waiting)
    scheduler.schedule(NOW)
    waiting.cancel_requested = True
    plan = scheduler.schedule(NOW + 10)
    aborts = {abort.sequence.request_id: abort for abort in plan.aborts}
    assert aborts["waiting"].error is not None and aborts["waiting"].error.type is ErrorType.CANCELED
    assert not aborts["waiting"].was_running and aborts["waiting"].error.message == "canceled by the client"
    late = aborts["running"].error
    assert aborts["running"].was_running and late is not None and late.type is ErrorType.TIMEOUT
    assert late.message == "job deadline passed while running"
    assert plan.decode == () and plan.prefill == () and not scheduler.has_work


def test_a_future_its_caller_cancelled_is_dropped_silently() -> None:
    scheduler = _scheduler()
    gone, kept = _sequence("gone"), _sequence("kept")
    gone.future.cancel()
    scheduler.add(gone)
    scheduler.add(kept)
    plan = scheduler.schedule(NOW)
    assert _names(plan.prefill) == ["kept"]
    assert [(abort.sequence.request_id, abort.error) for abort in plan.aborts] == [("gone", None)]


def test_take_all_empties_the_scheduler_running_first() -> None:
    scheduler = _scheduler(rows=1)
    for name in "ab":
        scheduler.add(_sequence(name))
    scheduler.schedule(NOW)
    assert [sequence.request_id for sequence in scheduler.take_all()] == ["a", "b"]
    assert not scheduler.has_work and scheduler.schedule(NOW).prefill == ()
