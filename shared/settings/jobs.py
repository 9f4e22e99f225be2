"""Settings of jobs and their queue: the models served, token bounds, how long records live, and
the deadlines, leases and attempts that make a job end exactly once."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from shared.settings.types import CommaList, split_commas


class JobSettings(BaseModel):
    """Jobs and the queue."""

    model: str = "smollm2-135m-instruct"
    """The model workers load (and the API's default for jobs that name none)."""

    models: CommaList = []
    """Further models served by other worker pools (each has its own queue genq.<model>)."""

    default_max_tokens: int = Field(256, ge=1)
    """max_tokens of a job that gives none."""

    max_tokens_cap: int = Field(1024, ge=1)
    """Largest max_tokens a job may ask for."""

    job_ttl_s: int = Field(7 * 86_400, ge=60)
    """How long job records (and their webhook logs) are kept."""

    job_timeout_s: float = Field(600.0, gt=0)
    """Bounds both a job's wait in the queue (counted from acceptance: a job still queued then is
    failed with a `timeout` error instead of run) and each run (counted from its start: a job still
    running then is stopped at the next step and fails with `timeout`)."""

    visibility_timeout_s: int = Field(1800, ge=1)
    """Seconds before the broker redelivers a message a worker took and never acknowledged (a
    killed worker's jobs come back after this). Must exceed job_timeout_s, or a long job is
    delivered twice."""

    max_attempts: int = Field(3, ge=1, le=100)
    """Most times a job is started. A job whose worker is lost (its lease lapsed: a crash, a kill,
    a hang) is handed back to the queue until it has been started this often, then failed with a
    `worker_lost` error. A drain's hand-back does not count."""

    lease_ttl_s: float = Field(30.0, gt=0)
    """A running job's lease: its worker renews it with each heartbeat; a job whose lease is older
    than this is handed back by the reaper (or taken over by a worker that receives it). Must
    exceed heartbeat_interval_s."""

    reaper_interval_s: float = Field(2.0, gt=0, le=60)
    """How often the reaper runs (in every API process; a Redis lock lets one run per period):
    hands back jobs with lapsed leases, fails queued jobs past their deadline, re-pushes the
    message of a queued job the broker lost, and promotes followers of a vanished leader."""

    _split_models = field_validator("models", mode="before")(split_commas)
