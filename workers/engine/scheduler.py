"""Which requests run in the next step: the step plan. Policy only: no tensors, no rows, no text.

Each step the scheduler (on the engine's loop thread):
  1. drops the sequences that finished since the last plan (their status says so);
  2. aborts cancelled sequences (`canceled`) and ones past their deadline (`timeout`), waiting or
     running alike, so their rows are freed before this step's forward pass;
  3. admits waiting sequences in FIFO order while the batch has fewer than max_batch_size sequences,
     their reservations (prompt + max_tokens, capped by the context) fit in max_batch_tokens (a
     reservation larger than the whole budget still runs, alone), and this step's prefill stays
     within max_prefill_tokens_per_step (at least one prompt is always admitted). A sequence whose
     caller cancelled its future itself is aborted silently.
A sequence admitted here counts against the limits for the whole step, even if it ends at its first
token. The plan names the sequences; the executor decides rows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from workers.engine.sequence import Sequence, SequenceStatus
from workers.engine.types import ErrorType, RequestError


@dataclass(frozen=True, slots=True)
class Abort:
    """A sequence to end before the step's forward passes."""

    sequence: Sequence
    #: What its future fails with; None when its caller cancelled the future (nothing to tell).
    error: RequestError | None
    #: Whether it was running (holds a row to release) rather than waiting.
    was_running: bool


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step does, in this order: aborts, prefills (each alone), one decode of every row."""

    aborts: tuple[Abort, ...]
    #: Admitted this step (status RUNNING): prefill each, then it decodes with the others.
    prefill: tuple[Sequence, ...]
    #: Running before this step and still running: one decode token each.
    decode: tuple[Sequence, ...]


@dataclass(frozen=True, slots=True)
class Limits:
    """The scheduler's bounds (EngineConfig's fields of the same names)."""

    max_batch_size: int
    max_batch_tokens: int
    max_prefill_tokens_per_step: int


class Scheduler:
    """Owns the waiting queue and the set of running sequences; plans each step (see the module)."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # admission order; rows are the executor's business

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return sum(sequence.status is SequenceStatus.RUNNING for sequence in self._running)

    @property
    def has_work(self) -> bool:
        """Whether a step may have anything to do (a sequence that just ended may still count)."""
        return bool(self._waiting or self._running)

    def add(self, sequence: Sequence) -> None:
        """Queue a submitted sequence (status WAITING)."""
        self._waiting.append(sequence)

    def schedule(self, now: float) -> StepPlan:
        """The next step's plan; admitted sequences become RUNNING (admitted_at = now)."""
        self._running = [sequence for sequence in self._running if sequence.status is SequenceStatus.RUNNING]
        aborts = self._waiting_aborts(now) + self._running_aborts(now)
        decode = tuple(self._running)
        prefill, dropped = self._admit(now)
        return StepPlan(aborts + dropped, prefill, decode)

    def take_all(self) -> list[Sequence]:
        """Every unfinished sequence held (running first), emptying the scheduler: the engine is ending."""
        held = [sequence for sequence in self._running if sequence.status is SequenceStatus.RUNNING]
        held.extend(self._waiting)
        self._running.clear()
        self._waiting.clear()
        return held

    def _waiting_aborts(self, now: float) -> tuple[Abort, ...]:
        aborts = []
        for sequence in self._waiting:
            error = abort_reason(sequence, now, "before it started")
            if error is not None:
                aborts.append(Abort(sequence, error, was_running=False))
        if aborts:
            aborted = {id(abort.sequence) for abort in aborts}
            self._waiting = deque(sequence for sequence in self._waiting if id(sequence) not in aborted)
        return tuple(aborts)

    def _running_aborts(self, now: float) -> tuple[Abort, ...]:
        # Checked inline first: this runs for every running sequence at every step.
        due = [
            sequence
            for sequence in self._running
            if sequence.cancel_requested
            or ((deadline := sequence.request.deadline) is not None and now > deadline)
        ]
        if not due:
            return ()
        self._running = [sequence for sequence in self._running if sequence not in due]
        return tuple(Abort(s, abort_reason(s, now, "while running"), was_running=True) for s in due)

    def _admit(self, now: float) -> tuple[tuple[Sequence, ...], tuple[Abort, ...]]:
        admitted: list[Sequence] = []
        dropped: list[Abort] = []
        prefill_tokens = 0
        while self._waiting and self._fits(self._waiting[0], prefill_tokens):
            sequence = self._waiting.popleft()
            if not sequence.future.set_running_or_notify_cancel():  # the caller cancelled the future itself
                dropped.append(Abort(sequence, None, was_running=False))
                continue
            sequence.status, sequence.admitted_at = SequenceStatus.RUNNING, now
            prefill_tokens += len(sequence.prompt_ids)
            self._running.append(sequence)
            admitted.append(sequence)
        return tuple(admitted), tuple(dropped)

    def _fits(self, sequence: Sequence, prefill_tokens: int) -> bool:
        limits = self._limits
        if len(self._running) >= limits.max_batch_size:
            return False
        if prefill_tokens and prefill_tokens + len(sequence.prompt_ids) > limits.max_prefill_tokens_per_step:
            return False
        reserved = sum(running.reservation for running in self._running)
        return not self._running or reserved + sequence.reservation <= limits.max_batch_tokens


def abort_reason(sequence: Sequence, now: float, where: str) -> RequestError | None:
    """Why a sequence must stop now (cancelled, or past its deadline), or None."""
    if sequence.cancel_requested:
        return RequestError(ErrorType.CANCELED, "canceled by the client")
    deadline = sequence.request.deadline
    if deadline is not None and now > deadline:
        return RequestError(ErrorType.TIMEOUT, f"job deadline passed {where}")
    return None
