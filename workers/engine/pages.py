"""Memory pages that hold nothing but zeros, handed back to the kernel.

llama.cpp allocates every row's KV cells up front and zeroes them (so that attention never reads
NaNs from unused cells): with 16 rows of 2048 tokens that makes 383 MiB resident before the first
job, although a row's cells are written only as its conversation grows. A private anonymous
page the kernel is told it may drop (madvise MADV_DONTNEED) reads as zeros again afterwards, and
reading it maps the kernel's shared zero page (no memory), so dropping a page that holds only
zeros changes no value anyone can read: only what is resident. The page becomes resident again
when a cell in it is written, so the KV cache's memory grows with the cells in use, up to what
llama.cpp allocated.

Linux only (/proc/self/maps, madvise); elsewhere nothing is released.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAGE_BYTES = mmap.PAGESIZE
#: glibc's malloc arenas are at most 64 MiB: a larger anonymous mapping is one allocation, whose
#: owner alone writes to it (a smaller one may be an arena shared by every thread's small mallocs).
_ARENA_MAX_BYTES = 64 << 20
_MAPS = Path("/proc/self/maps")


@dataclass(frozen=True, order=True)
class Region:
    """An address range [start, end) of this process's memory."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def anonymous_mappings() -> list[Region]:
    """This process's private, writable, anonymous mappings (the kernel merges neighbours with the
    same flags into one); empty where /proc/self/maps cannot be read."""
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return []
    regions = []
    for line in lines:
        fields = line.split()
        span, perms, inode = fields[0], fields[1], fields[4]
        if len(fields) > 5 or inode != "0" or not perms.startswith("rw") or perms[3] != "p":
            continue  # a file, a named region ([heap], [stack]) or a shared or read-only one
        start, end = (int(bound, 16) for bound in span.split("-"))
        regions.append(Region(start, end))
    return regions


def new_large_regions(before: list[Region]) -> set[Region]:
    """The address ranges of anonymous_mappings() that `before` (an earlier listing) did not hold,
    each longer than any malloc arena: memory allocated since, one allocation per range. Only new
    addresses count, so a new allocation the kernel merged into an old mapping brings none of
    the old one's pages."""
    earlier = sorted(before)
    regions = set()
    for mapping in anonymous_mappings():
        cursor = mapping.start
        for old in earlier:
            if old.end <= cursor or old.start >= mapping.end:
                continue
            if old.start > cursor:
                regions.add(Region(cursor, old.start))
            cursor = max(cursor, old.end)
        if cursor < mapping.end:
            regions.add(Region(cursor, mapping.end))
    return {region for region in regions if region.size > _ARENA_MAX_BYTES}


def release_zero_pages(regions: set[Region]) -> int:
    """Hand back to the kernel every page of `regions` that holds only zeros; the bytes released.
    The caller must know that no thread writes to these regions meanwhile (a write between the
    check and the release would be lost); a region no longer mapped is skipped (its owner freed
    it: reading it could fault)."""
    madvise = _madvise()
    if madvise is None:
        return 0
    released = 0
    mapped = anonymous_mappings()
    for region in sorted(regions):
        if not any(outer.start <= region.start and region.end <= outer.end for outer in mapped):
            continue
        for start, length in _zero_runs(region):
            if madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), mmap.MADV_DONTNEED) == 0:
                released += length
    return released


def _zero_runs(region: Region) -> list[tuple[int, int]]:
    """(address, bytes) of each run of consecutive whole pages in `region` that hold only zeros."""
    pages = region.size // PAGE_BYTES
    words = (ctypes.c_uint64 * (pages * PAGE_BYTES // 8)).from_address(region.start)
    zero = ~np.ctypeslib.as_array(words).reshape(pages, PAGE_BYTES // 8).any(axis=1)
    # Run boundaries: where `zero` changes, with a non-zero page assumed on either side.
    edges = np.flatnonzero(np.diff(np.concatenate(([False], zero, [False])).astype(np.int8)))
    return [
        (region.start + int(first) * PAGE_BYTES, int(last - first) * PAGE_BYTES)
        for first, last in zip(edges[::2], edges[1::2], strict=True)
    ]


def _madvise() -> Callable[..., int] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    madvise = getattr(libc, "madvise", None)
    if madvise is None or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise  # type: ignore[no-any-return]
