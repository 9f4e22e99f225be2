"""Memory pages that hold nothing but zeros, handed back to the kernel.

llama.cpp allocates every row's KV cells up front and zeroes them (so that attention never reads
NaNs from unused cells): with 16 rows of 2048 tokens that makes 383 MiB resident before the first
job, although a row's cells are written only as its conversation grows. A private anonymous
page the kernel is told it may drop (madvise MADV_DONTNEED) reads as zeros again afterwards, and
reading it maps the kernel's shared zero page (no memory), so dropping a page that holds only
zeros changes no value anyone can read: only what is resident. The page becomes resident again
when a cell in it is written, so the KV cache's memory grows with the cells in use, up to what
llama.cpp allocated. ZeroPageWatch does it once llama.cpp is idle, and also while its context
constructor zeroes the streams, so they are never all resident at once.

Linux only (/proc/self/maps, mincore, process_vm_readv, madvise); elsewhere nothing is released.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAGE_BYTES = mmap.PAGESIZE
#: glibc's malloc arenas are at most 64 MiB: a larger anonymous mapping is one allocation, whose
#: owner alone writes to it (a smaller one may be an arena shared by every thread's small mallocs).
ARENA_MAX_BYTES = 64 << 20
_MAPS = Path("/proc/self/maps")
#: glibc's chunk header flags (the low bits of its size word), and the one a mapped chunk carries.
_FLAG_BITS = 0x7
_IS_MMAPPED = 0x2
#: Bytes read of each page's start: the chunk header's two words.
_HEAD_BYTES = 16
#: Most iovecs one process_vm_readv takes (Linux's UIO_MAXIOV).
_IOV_MAX = 1024
#: Most pages read at once to check them for zeros (1 MiB: the buffer is resident while it runs).
_READ_PAGES = 256
#: Seconds between two passes of ZeroPageWatch.meanwhile's thread.
_FOLLOW_INTERVAL_S = 0.001


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


def new_large_regions(before: list[Region], mappings: list[Region] | None = None) -> set[Region]:
    """The allocations larger than any malloc arena that glibc mapped since `before` (an earlier
    anonymous_mappings()): each range of addresses that listing did not hold is searched for the
    header glibc writes at the start of a memory-mapped chunk (_mmapped_chunks), and only the
    chunks' own addresses count. The kernel merges neighbouring mappings with the same flags,
    so a new range may also hold other allocations made meanwhile (Python's arenas, numpy's
    buffers, other libraries' memory) whose zero pages their owners may write at any moment: they
    are never part of a region. (Taking whole new ranges released such pages too, and a page
    written between the check and the release lost its data: 2 of 8 runs of bench.sampling
    crashed later, in whatever code read it.) `mappings`: a listing just made, if the caller has
    one."""
    ranges = _new_ranges(before, anonymous_mappings() if mappings is None else mappings)
    return {chunk for new in ranges for chunk in _mmapped_chunks(new)}


def _new_ranges(before: list[Region], mappings: list[Region]) -> list[Region]:
    """The address ranges of `mappings` that `before` did not hold."""
    earlier = sorted(before)
    ranges = []
    for mapping in mappings:
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
    0x2). posix_memalign, which ggml allocates with, leaves that first header in place. Pages are
    read _IOV_MAX at a time and a chunk found is skipped whole, so a chunk of any size costs one
    read (a look while llama.cpp zeroes its KV cache must not lag behind it)."""
    chunks = []
    page, pages = 0, new.size // PAGE_BYTES
    while page < pages:
        block = Region(new.start + page * PAGE_BYTES, new.start + min(pages, page + _IOV_MAX) * PAGE_BYTES)
        chunk = _first_chunk(block, new.end)
        chunks.extend([chunk] if chunk else [])
        page = (chunk.end - new.start) // PAGE_BYTES if chunk else page + block.size // PAGE_BYTES
    return chunks


def _first_chunk(block: Region, limit: int) -> Region | None:
    """The first chunk whose header lies on a page of `block` and whose end is within `limit`."""
    heads = _page_heads(block)
    sizes = heads[:, 1] & ~np.uint64(_FLAG_BITS)
    is_head = (heads[:, 0] == 0) & (heads[:, 1] & np.uint64(_FLAG_BITS) == _IS_MMAPPED)
    fits = (sizes > ARENA_MAX_BYTES) & (sizes % PAGE_BYTES == 0)
    for page in np.flatnonzero(is_head & fits):
        start = block.start + int(page) * PAGE_BYTES
        if start + int(sizes[page]) <= limit:
            return Region(start, start + int(sizes[page]))
    return None


def _page_heads(block: Region) -> np.ndarray:
    """The first two 64-bit words of each page of `block`, at most _IOV_MAX pages ([pages, 2];
    zeros where a page could not be read). Read with process_vm_readv from this very process, which
    answers a page unmapped meanwhile with an error, not a segmentation fault: the range may hold
    others' memory."""
    pages = block.size // PAGE_BYTES
    heads = np.zeros((pages, 2), dtype=np.uint64)
    readv = _process_vm_readv()
    if readv is None or pages == 0:
        return heads
    index = np.arange(pages, dtype=np.uint64)
    local = np.stack(
        [heads.ctypes.data + index * _HEAD_BYTES, np.full(pages, _HEAD_BYTES, np.uint64)], axis=1
    )
    remote = np.stack([block.start + index * PAGE_BYTES, np.full(pages, _HEAD_BYTES, np.uint64)], axis=1)
    page, pid = 0, os.getpid()
    while page < pages:
        count = pages - page
        offset = page * 2 * 8  # one (base, length) pair of 64-bit words per page
        done = readv(pid, local.ctypes.data + offset, count, remote.ctypes.data + offset, count, 0)
        if done < 0:
            return np.zeros((pages, 2), dtype=np.uint64)  # not allowed here (seccomp): no candidates
        read = done // _HEAD_BYTES
        page += read if read == count else read + 1  # the page it stopped at could not be read
    return heads


def release_zero_pages(regions: set[Region], mapped: list[Region] | None = None) -> int:
    """Hand back to the kernel every resident page of `regions` that holds only zeros; the bytes
    released. Only resident pages are read (mincore): a page never written, or handed back before,
    holds no memory to hand back. Pages are read with process_vm_readv, so a region unmapped
    meanwhile is skipped, never a fault. A write between a page's check and its release would be
    lost: the caller must know that no thread writes anything but zeros to these regions meanwhile
    (ZeroPageWatch.meanwhile). A region no longer mapped is skipped (its owner freed it).
    `mapped`: an anonymous_mappings() listing just made, if the caller has one."""
    madvise = _madvise()
    if madvise is None:
        return 0
    released = 0
    mapped = anonymous_mappings() if mapped is None else mapped
    for region in sorted(regions):
        if not any(outer.start <= region.start and region.end <= outer.end for outer in mapped):
            continue
        for start, length in _resident_zero_runs(region):
            if madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), mmap.MADV_DONTNEED) == 0:
                released += length
    return released


def resident_bytes(region: Region) -> int:
    """Bytes of the page-aligned `region` mapped now (mincore: pages a read mapped to the kernel's
    shared zero page count, although they take no memory)."""
    return int(_resident(region).sum()) * PAGE_BYTES


def drop_pages(region: Region) -> int:
    """Hand back the pages of `region` (page-aligned) whatever they hold: they read as zeros after
    (the caller knows nothing reads what they held); the resident bytes handed back, as mincore
    counts them (a page a read mapped to the kernel's shared zero page counts too)."""
    madvise = _madvise()
    resident = resident_bytes(region)
    if madvise is None or not resident:
        return 0
    if madvise(ctypes.c_void_p(region.start), ctypes.c_size_t(region.size), mmap.MADV_DONTNEED) != 0:
        return 0
    return resident


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the kernel (glibc's malloc_trim, every arena): memory
    freed by native code stays resident otherwise, as the tokenizer's parsing of its 3.5 MB JSON
    leaves it (measured when llguidance's view was built at start too: the default worker's peak
    8-10 MiB lower). A no-op where libc has no malloc_trim (musl, macOS)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _resident_zero_runs(region: Region) -> list[tuple[int, int]]:
    """(address, bytes) of each run of consecutive resident pages in `region` that hold only zeros."""
    buffer = np.empty((_READ_PAGES, PAGE_BYTES // 8), dtype=np.uint64)  # one, reused: fresh pages cost
    runs: list[tuple[int, int]] = []
    for first, last in _runs(_resident(region)):
        for piece in range(first, last, _READ_PAGES):
            start = region.start + piece * PAGE_BYTES
            pages = buffer[: min(_READ_PAGES, last - piece)]
            if not _read_into(pages, start):
                return runs  # unmapped meanwhile
            zero = np.logical_not(pages.any(axis=1))
            runs += [(start + a * PAGE_BYTES, (b - a) * PAGE_BYTES) for a, b in _runs(zero)]
    return runs


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[first, last) index pairs of each run of True in `flags`."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], flags, [False])).astype(np.int8)))
    return [(int(first), int(last)) for first, last in zip(edges[::2], edges[1::2], strict=True)]


def _resident(region: Region) -> np.ndarray:
    """Which pages of `region` are resident (mincore); none where it cannot say (unmapped)."""
    pages = region.size // PAGE_BYTES
    vector = np.zeros(pages, dtype=np.uint8)
    mincore = _mincore()
    if mincore is None or mincore(ctypes.c_void_p(region.start), region.size, vector.ctypes.data) != 0:
        return np.zeros(pages, dtype=bool)
    return (vector & 1).astype(bool)


def _read_into(pages: np.ndarray, start: int) -> bool:
    """Fill `pages` with the memory from `start` on, read with process_vm_readv; False when it
    cannot all be read (unmapped meanwhile, or not allowed here)."""
    readv = _process_vm_readv()
    if readv is None:
        return False
    local = (ctypes.c_uint64 * 2)(pages.ctypes.data, pages.nbytes)
    remote = (ctypes.c_uint64 * 2)(start, pages.nbytes)
    done = readv(os.getpid(), ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
    return bool(done == pages.nbytes)


class ZeroPageWatch:
    """The chunks glibc maps for large allocations from its creation on (new_large_regions), and
    their pages that hold only zeros handed back to the kernel: once no call writes to them
    (release), or while a call that writes nothing but zeros there runs (meanwhile).

    llama.cpp's context constructor allocates the KV streams and zeroes all of them with one
    memset (383 MiB at 16 rows of 2048 cells): handed back only after it, every page of them was
    resident at once, the worker's peak. Pages a memset of zeros has passed hold only zeros, so
    a thread beside it hands them back as it goes, and the peak holds what the memset has written
    since the thread's last pass (tests/workers/engine/test_llamacpp_executor.py checks that
    llama.cpp writes nothing but zeros into these chunks in the calls made `meanwhile`).
    """

    def __init__(self) -> None:
        self._seen = anonymous_mappings()
        #: The chunks found so far.
        self.chunks: set[Region] = set()
        #: Bytes handed back so far (a page written and handed back again counts again).
        self.released = 0

    def look(self, mappings: list[Region] | None = None) -> None:
        """Add the chunks mapped since the last look."""
        found = new_large_regions(self._seen, mappings)
        self._seen.extend(found)  # later looks skip them
        self.chunks |= found

    def release(self) -> None:
        """Hand back the chunks' resident zero pages; no thread may write to them meanwhile."""
        self.released += release_zero_pages(self.chunks)

    @contextlib.contextmanager
    def meanwhile(self) -> Iterator[None]:
        """While the block runs one call that releases the GIL (a llama.cpp call) and writes nothing
        but zeros to the chunks, those it maps included, a thread looks for new chunks and hands
        back their resident zero pages every _FOLLOW_INTERVAL_S; after it, one last look."""
        stop = threading.Event()
        thread = threading.Thread(target=self._follow, args=(stop,), name="genq-zero-pages", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
        self.look()

    def _follow(self, stop: threading.Event) -> None:
        while True:
            mappings = anonymous_mappings()
            self.look(mappings)
            self.released += release_zero_pages(self.chunks, mappings)
            if stop.wait(_FOLLOW_INTERVAL_S):
                return


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


def _mincore() -> Callable[..., int] | None:
    mincore = getattr(_libc(), "mincore", None)
    if mincore is None:
        return None
    mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    mincore.restype = ctypes.c_int
    return mincore  # type: ignore[no-any-return]


def _madvise() -> Callable[..., int] | None:
    madvise = getattr(_libc(), "madvise", None)
    if madvise is None or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise  # type: ignore[no-any-return]
