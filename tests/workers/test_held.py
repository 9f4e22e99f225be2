"""workers/held.py: the jobs a worker holds, and which of them a drain stopped (those go back to
the queue rather than finish)."""

from __future__ import annotations

import threading

from workers.held import HeldJobs


def test_a_held_job_is_known_until_released() -> None:
    held = HeldJobs()
    held.hold("j1", {"queue": "q"})
    assert "j1" in held and len(held) == 1 and held.records() == {"j1": {"queue": "q"}}
    assert held.release("j1") is False  # not drained: its thread finishes it
    assert "j1" not in held and held.ids() == []


def test_a_drain_marks_the_jobs_held_then_and_only_those() -> None:
    held = HeldJobs()
    held.hold("j1", {})
    held.hold("j2", {})
    assert sorted(held.drain()) == ["j1", "j2"]
    held.hold("j3", {})  # claimed after the drain's timeout
    assert held.release("j1") is True and held.release("j3") is False
    assert held.release("j1") is False  # released once: a second release finds nothing


def test_threads_hold_and_release_at_once() -> None:
    held = HeldJobs()

    def churn(thread: int) -> None:
        for index in range(500):
            held.hold(f"{thread}-{index}", {})
            held.release(f"{thread}-{index}")

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(held) == 0
