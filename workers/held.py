"""The jobs one worker holds: each running job's record by id (a hand-back rebuilds the job's
message from it), and which of them a drain's timeout stopped, so that their thread hands them
back instead of finishing them. Task threads, the heartbeat, the cancel listener and the drain
read and change it at once."""

from __future__ import annotations

import threading


class HeldJobs:
    """The jobs this worker runs, by id, and those a drain stopped (thread-safe)."""

    def __init__(self) -> None:
        self._records: dict[str, dict[str, str]] = {}
        self._drained: set[str] = set()
        self._lock = threading.Lock()

    def hold(self, job_id: str, record: dict[str, str]) -> None:
        """A job this worker claimed starts running here."""
        with self._lock:
            self._records[job_id] = record

    def release(self, job_id: str) -> bool:
        """The job no longer runs here; whether a drain stopped it (then it goes back to the queue)."""
        with self._lock:
            self._records.pop(job_id, None)
            drained = job_id in self._drained
            self._drained.discard(job_id)
        return drained

    def drain(self) -> list[str]:
        """Mark every job held now as stopped by the drain; their ids."""
        with self._lock:
            held = list(self._records)
            self._drained.update(held)
        return held

    def records(self) -> dict[str, dict[str, str]]:
        """A copy of the held jobs' records, by id."""
        with self._lock:
            return dict(self._records)

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._records)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._records

    def __len__(self) -> int:
        return len(self._records)
