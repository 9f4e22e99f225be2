"""Memory pages that hold nothing but zeros, handed back to the kernel.

llama.cpp allocates every row's KV cells up front and zeroes them (so that attention never reads
NaNs from unused cells): with 16 rows of 2048 tokens that makes 383 MiB resident before the first
job, although a row's cells are written only as its conversation grows. A private anonymous
page the kernel is told it may drop (madvise MADV_DONTNEED) reads as zeros again afterwards, and
reading it maps the kernel's shared zero page (no memory), so dropping a page that holds only
zeros changes no value anyone can read: only what is resident. The page becomes resident again
when a cell in it is written, so the KV cache's memory grows with the cells in use, up to what
llama.cpp allocated.

Linux only (/proc/self/maps, process_vm_readv, madvise); elsewhere nothing is released.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAGE_BYTES = mmap.PAGESIZE
#: glibc's malloc arenas are at most 64 MiB: a larger anonymous mapping is one allocation, whose
#: owner alone writes to it (a smaller one may be an arena shared by every thread's small mallocs).
_ARENA_MAX_BYTES = 64 << 20
_MAPS = Path("/proc/self/maps")
#: glibc's chunk header flags (the low bits of its size word), and the one a mapped chunk carries.
_FLAG_BITS = 0x7
_IS_MMAPPED = 0x2
#: Bytes read of each page's start: the chunk header's two words.
_HEAD_BYTES = 16
#: Most iovecs one process_vm_readv takes (Linux's UIO_MAXIOV).
_IOV_MAX = 1024


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
    """The allocations larger than any malloc arena that glibc mapped since `before` (an earlier
    anonymous_mappings()): each range of addresses that listing did not hold is searched for the
    header glibc writes at the start of a memory-mapped chunk (_mmapped_chunks), and only the
    chunks' own addresses count. The kernel merges neighbouring mappings with the same flags,
    so a new range may also hold other allocations made meanwhile (Python's arenas, numpy's
    buffers, other libraries' memory) whose zero pages their owners may write at any moment: they
    are never part of a region. (Taking whole new ranges released such pages too, and a page
    written between the check and the release lost its data: 2 of 8 runs of bench.sampling
    crashed later, in whatever code read it.)"""
    return {chunk for new in _new_ranges(before) for chunk in _mmapped_chunks(new)}


def _new_ranges(before: list[Region]) -> list[Region]:
    """The address ranges of anonymous_mappings() that `before` did not hold."""
    earlier = sorted(before)
    ranges = []
    for mapping in anonymous_mappings():
        cursor = mapping.start
        for old in earlier:
            if old.end <= cursor or old.start >= mapping.end:
                continue
            if old.start > cursor:
                ranges.append(Region(cursor, old.start))
            cursor = max(cursor, old.end)
        if cursor < mapping.end:
            ranges.append(Region(cursor, mapping.end))
    return ranges


def _mmapped_chunks(new: Region) -> list[Region]:
    """The chunks larger than any malloc arena that glibc's malloc mapped in `new`: mmap gives a
    large allocation pages of its own, and glibc writes the chunk's header at their start (a zero
    word, then the chunk's size in bytes, a multiple of the page size, with its IS_MMAPPED flag,
    0x2). posix_memalign, which ggml allocates with, leaves that first header in place."""
    heads = _page_heads(new)
    chunks = []
    page = 0
    while page < len(heads):
        size = int(heads[page, 1]) & ~_FLAG_BITS
        is_chunk = heads[page, 0] == 0 and int(heads[page, 1]) & _FLAG_BITS == _IS_MMAPPED
        start = new.start + page * PAGE_BYTES
        if is_chunk and size > _ARENA_MAX_BYTES and size % PAGE_BYTES == 0 and start + size <= new.end:
            chunks.append(Region(start, start + size))
            page += size // PAGE_BYTES
        else:
            page += 1
    return chunks


def _page_heads(new: Region) -> np.ndarray:
    """The first two 64-bit words of each page of `new` ([pages, 2]; zeros where a page could not
    be read). Read with process_vm_readv from this very process, which answers a page unmapped
    meanwhile with an error, not a segmentation fault: the range may hold others' memory."""
    pages = new.size // PAGE_BYTES
    heads = np.zeros((pages, 2), dtype=np.uint64)
    readv = _process_vm_readv()
    if readv is None or pages == 0:
        return heads
    index = np.arange(pages, dtype=np.uint64)
    local = np.stack(
        [heads.ctypes.data + index * _HEAD_BYTES, np.full(pages, _HEAD_BYTES, np.uint64)], axis=1
    )
    remote = np.stack([new.start + index * PAGE_BYTES, np.full(pages, _HEAD_BYTES, np.uint64)], axis=1)
    page, pid = 0, os.getpid()
    while page < pages:
        count = min(_IOV_MAX, pages - page)
        offset = page * 2 * 8  # one (base, length) pair of 64-bit words per page
        done = readv(pid, local.ctypes.data + offset, count, remote.ctypes.data + offset, count, 0)
        if done < 0:
            return np.zeros((pages, 2), dtype=np.uint64)  # not allowed here (seccomp): no candidates
        read = done // _HEAD_BYTES
        page += read if read == count else read + 1  # the page it stopped at could not be read
    return heads


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


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _process_vm_readv() -> Callable[..., int] | None:
    readv = getattr(_libc(), "process_vm_readv", None)
    if readv is None:
        return None
    readv.argtypes = (
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_ulong,
    )
    readv.restype = ctypes.c_ssize_t
    return readv  # type: ignore[no-any-return]


def _madvise() -> Callable[..., int] | None:
    madvise = getattr(_libc(), "madvise", None)
    if madvise is None or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise  # type: ignore[no-any-return]
