"""The worker's heartbeat: every interval it says the worker is alive (its entry in the fleet
registry, with its slots), renews the leases of the jobs it runs and stops those it no longer
holds (canceled, ended elsewhere, or handed to another worker), and keeps its ready file fresh.
A beat Redis refuses or cannot take is logged and tried again at the next one."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis.exceptions

from shared.logging import fields
from workers.jobs import WorkerJobs

log = logging.getLogger("genq.worker")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    jobs: WorkerJobs
    worker_id: str
    registry: str
    #: Jobs the worker runs at once (a model worker's), None for a webhook-only worker.
    slots: int | None
    ready_file: Path
    #: The ids of the jobs the worker runs now.
    held: Callable[[], list[str]]
    #: Called with each job whose lease the worker lost: it must stop generating it.
    lost: Callable[[str], None]
    #: Called first at each beat (the pod's deletion cost follows the worker's load).
    before: Callable[[], None]

    def beat(self) -> None:
        self.before()
        self.jobs.heartbeat(self.worker_id, self.registry, self.slots)
        for job_id in self.jobs.renew(self.worker_id, self.held()):
            log.info("lease_lost", extra=fields(job_id=job_id))
            self.lost(job_id)
        if self.ready_file.exists():
            self.ready_file.touch()

    def start(self, interval_s: float, stopped: threading.Event) -> None:
        """Beat now, then every interval_s on a daemon thread until `stopped` is set."""
        self.beat()
        threading.Thread(
            target=self._loop, args=(interval_s, stopped), name="genq-heartbeat", daemon=True
        ).start()

    def _loop(self, interval_s: float, stopped: threading.Event) -> None:
        while not stopped.wait(interval_s):
            try:
                self.beat()
            except redis.exceptions.RedisError as exc:
                log.warning("heartbeat_failed", extra=fields(error=str(exc)))
