"""A page of one owner's job summaries, newest first, read in bounded bytes.

A summary carries the job's metadata (up to tens of KiB), so reading candidates' summaries to
find a status filter's matches could pull megabytes for an empty page. So each page is read in
two passes: first each candidate's head (its status and the sizes of its variable fields, a few
bytes each), then the summaries of the matches only, as many as fit the page's byte budget
(GENQ_LIST_MAX_BYTES) by their heads' sizes. A page that would pass the budget ends early with a
cursor, so the bytes read per request are bounded, not only those returned.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.jobs.store import JobHead, JobStore
from shared.jobqueue.records import job_summary
from shared.schemas import JobStatus, JobSummaryView

#: Rounds of candidates one request reads before it answers with a cursor: a status filter over a
#: long history costs at most this many rounds of heads.
SCAN_ROUNDS = 20

#: Bytes of a summary besides its metadata and error (id, urls, times, preview): what a head's
#: sizes are topped up by to estimate the summary.
SUMMARY_OVERHEAD = 1024


@dataclass(frozen=True, slots=True)
class Picked:
    """The candidates whose summaries one round reads, and where the page stands after it."""

    job_ids: list[str]
    #: The cursor after the round (the last candidate it passed); None when nothing was passed.
    last_score: float | None
    #: Whether the page is complete (full, or at its byte budget) once these are read.
    done: bool
    budget_left: int


def pick(
    page: list[tuple[str, float]],
    heads: list[JobHead | None],
    status: JobStatus | None,
    wanted: int,
    budget: int,
    last_score: float | None,
    have: int,
) -> Picked:
    """The round's matches whose summaries fit `budget`, up to `wanted` of them; `have` is how
    many the page holds already (the first summary is always read, whatever its size)."""
    chosen: list[str] = []
    for (job_id, score), head in zip(page, heads, strict=True):
        if head is not None and (status is None or head.status is status):
            cost = head.summary_bytes + SUMMARY_OVERHEAD
            if cost > budget and (have or chosen):
                return Picked(chosen, last_score, True, budget)
            budget -= cost
            chosen.append(job_id)
            if len(chosen) == wanted:
                return Picked(chosen, score, True, budget)
        last_score = score
    return Picked(chosen, last_score, False, budget)


async def list_page(
    store: JobStore, owner: str, status: JobStatus | None, limit: int, cursor: int | None, max_bytes: int
) -> tuple[list[JobSummaryView], str | None]:
    """A page of the owner's job summaries, newest first; the cursor is the last score passed."""
    max_score = "+inf" if cursor is None else f"({cursor}"
    found: list[JobSummaryView] = []
    budget, last_score = max_bytes, None
    for _ in range(SCAN_ROUNDS):
        page = await store.page(owner, max_score, max(limit * 2, 50))
        if not page:
            return found, None
        heads = await store.heads([job_id for job_id, _ in page])
        picked = pick(page, heads, status, limit - len(found), budget, last_score, len(found))
        budget, last_score = picked.budget_left, picked.last_score
        for record in await store.get_summaries(picked.job_ids):
            # Its status may have moved since its head was read: the filter holds on the record.
            if status is None or JobStatus(record["status"]) is status:
                found.append(job_summary(record))
        if picked.done:
            return found, _cursor(last_score)
        max_score = f"({int(page[-1][1])}"
    return found, _cursor(last_score)


def _cursor(score: float | None) -> str | None:
    return None if score is None else str(int(score))
