"""Zero pages handed back to the kernel (workers/engine/pages.py), on real mappings of this process:
the pages that held only zeros stop being resident and still read as zeros, the others keep
their data, and only new mappings that are one allocation each are ever candidates."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from workers.engine.pages import (
    PAGE_BYTES,
    Region,
    ZeroPageWatch,
    anonymous_mappings,
    drop_pages,
    new_large_regions,
    release_zero_pages,
    resident_bytes,
    return_freed_memory,
)

MIB = 1 << 20
PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


def _region_of(memory: mmap.mmap) -> Region:
    view = ctypes.c_char.from_buffer(memory)
    start = ctypes.addressof(view)
    del view  # a live export would keep the mapping from closing
    return Region(start, start + len(memory))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.posix_memalign.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t)
_libc.free.argtypes = (ctypes.c_void_p,)


def _resident_bytes(region: Region) -> int:
    """Bytes of `region` that hold memory of their own: pages present and mapped by this process
    alone (/proc/self/pagemap bits 63 and 56; the kernel's shared zero page, which a released
    page maps when read, is present but not exclusive)."""
    pages = region.size // PAGE_BYTES
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(region.start // PAGE_BYTES * 8)
        entries = np.frombuffer(pagemap.read(pages * 8), dtype=np.uint64)
    own = (entries >> np.uint64(63)) & (entries >> np.uint64(56)) & np.uint64(1)
    return int(own.sum()) * PAGE_BYTES


class Allocation:
    """96 MiB from glibc's posix_memalign, as ggml allocates llama.cpp's KV buffer (too large for
    any malloc arena: a mapping of its own, the chunk header at its first page), every byte
    written with zeros as llama.cpp's constructor does. Indexed by offset from the chunk's start."""

    def __init__(self, size: int = 96 * MIB) -> None:
        pointer = ctypes.c_void_p()
        assert _libc.posix_memalign(ctypes.byref(pointer), 64, size) == 0 and pointer.value
        self.pointer = pointer.value
        ctypes.memset(self.pointer, 0, size)
        chunk = self.pointer - self.pointer % PAGE_BYTES
        self.region = Region(chunk, chunk + ctypes.c_uint64.from_address(chunk + 8).value & ~7)
        assert self.region.start < self.pointer and self.pointer + size <= self.region.end

    def __getitem__(self, index: int | slice) -> int | bytes:
        if isinstance(index, slice):
            return ctypes.string_at(self.region.start + index.start, index.stop - index.start)
        return ctypes.c_uint8.from_address(self.region.start + index).value

    def __setitem__(self, index: int, value: int) -> None:
        ctypes.c_uint8.from_address(self.region.start + index).value = value

    def free(self) -> None:
        _libc.free(self.pointer)


@pytest.fixture
def private_mapping() -> Iterator[tuple[Allocation, Region]]:
    """Every page resident, as llama.cpp's KV buffer is after its constructor."""
    before = anonymous_mappings()
    memory = Allocation()
    assert new_large_regions(before) == {memory.region}
    assert _resident_bytes(memory.region) == memory.region.size
    yield memory, memory.region
    memory.free()


def test_pages_holding_only_zeros_go_back_and_still_read_as_zeros(
    private_mapping: tuple[Allocation, Region],
) -> None:
    memory, region = private_mapping
    written = [3, 4, 1000, region.size // PAGE_BYTES - 1]  # pages with data, the last one included
    for page in written:
        memory[page * PAGE_BYTES + 7] = 0x5A
    resident = _resident_bytes(region)

    released = release_zero_pages({region})

    # Every page but the written ones and the first (the chunk's header).
    assert released == region.size - (len(written) + 1) * PAGE_BYTES
    assert resident - _resident_bytes(region) == released
    for page in written:  # the data stayed
        assert memory[page * PAGE_BYTES + 7] == 0x5A
    assert memory[PAGE_BYTES : 3 * PAGE_BYTES] == b"\0" * (2 * PAGE_BYTES)  # a released page reads as zeros
    assert resident - _resident_bytes(region) == released  # and reading it takes no memory
    memory[5 * PAGE_BYTES] = 1  # writing makes that page resident again, with the value written
    assert memory[5 * PAGE_BYTES] == 1
    assert resident - _resident_bytes(region) == released - PAGE_BYTES


def test_a_page_not_resident_is_neither_read_nor_counted(private_mapping: tuple[Allocation, Region]) -> None:
    """Only resident pages are read: a second release finds the zeros it handed back not resident
    (reading them would map the zero page for nothing), and the written page still there."""
    memory, region = private_mapping
    memory[PAGE_BYTES] = 1
    assert release_zero_pages({region}) == region.size - 2 * PAGE_BYTES
    assert release_zero_pages({region}) == 0
    assert memory[PAGE_BYTES] == 1


def test_dropped_pages_go_back_whatever_they_held_and_their_neighbours_keep_theirs(
    private_mapping: tuple[Allocation, Region],
) -> None:
    """What kv_pages hands back past a row's cells: every page of the range, data or not, reads as
    zeros after and holds no memory; the pages either side keep their data."""
    memory, region = private_mapping
    for page in (10, 11, 12, 13):
        memory[page * PAGE_BYTES + 100] = 0x5A
    dropped = Region(region.start + 11 * PAGE_BYTES, region.start + 13 * PAGE_BYTES)
    own = _resident_bytes(region)

    assert resident_bytes(dropped) == 2 * PAGE_BYTES
    assert drop_pages(dropped) == 2 * PAGE_BYTES
    assert own - _resident_bytes(region) == 2 * PAGE_BYTES
    assert [memory[page * PAGE_BYTES + 100] for page in (10, 11, 12, 13)] == [0x5A, 0, 0, 0x5A]
    assert own - _resident_bytes(region) == 2 * PAGE_BYTES  # reading them took no memory
    assert drop_pages(Region(dropped.start, dropped.start + PAGE_BYTES)) == PAGE_BYTES  # mincore: mapped


@pytest.mark.parametrize(
    ("size", "flags"),
    [(64 * MIB, PRIVATE), (96 * MIB, mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)],
    ids=["arena-sized", "shared"],
)
def test_arena_sized_and_shared_mappings_are_never_candidates(size: int, flags: int) -> None:
    """A malloc arena (≤ 64 MiB) holds every thread's small blocks; a shared mapping may be
    written by another process."""
    before = anonymous_mappings()
    memory = mmap.mmap(-1, size, flags=flags)
    try:
        assert new_large_regions(before) == set()
    finally:
        memory.close()


def test_a_file_mapping_is_never_a_candidate(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * (96 * MIB))
    before = anonymous_mappings()
    with path.open("r+b") as file:
        memory = mmap.mmap(file.fileno(), 0, flags=mmap.MAP_PRIVATE)
    try:
        assert new_large_regions(before) == set()
    finally:
        memory.close()


def test_memory_that_is_no_malloc_chunk_is_never_a_candidate() -> None:
    """The kernel merges new mappings with the same flags into one: a new range may hold Python's
    arenas, numpy's buffers or another library's mmap beside llama.cpp's chunks. Without glibc's
    header at its start, memory is someone else's, however large."""
    before = anonymous_mappings()
    memory = mmap.mmap(-1, 200 * MIB, flags=PRIVATE)
    try:
        assert new_large_regions(before) == set()
    finally:
        memory.close()


def test_in_a_merged_range_only_the_chunks_own_pages_are_candidates() -> None:
    """A range as a starting worker shows it: other memory, then a chunk (its header written here
    as glibc writes it, 100 MiB in), then more memory after the chunk's end."""
    before = anonymous_mappings()
    memory = mmap.mmap(-1, 200 * MIB, flags=PRIVATE)
    region = _region_of(memory)
    chunk = Region(region.start + 100 * MIB, region.start + 196 * MIB)
    memory[100 * MIB + 8 : 100 * MIB + 16] = (chunk.size | 0x2).to_bytes(8, "little")
    try:
        assert new_large_regions(before) == {chunk}
        # Begun before the listing: not a new allocation, though its end is new.
        assert new_large_regions([*before, Region(region.start, chunk.start + MIB)]) == set()
    finally:
        memory.close()


def test_a_region_no_longer_mapped_is_skipped() -> None:
    memory = mmap.mmap(-1, 96 * MIB, flags=PRIVATE)
    region = _region_of(memory)
    memory.close()  # its owner freed it: reading it now would be a segmentation fault
    assert release_zero_pages({region}) == 0


def _peak_bytes() -> int:
    return int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) * 1024


def _only_zeros(start: int, end: int) -> bool:
    words = (ctypes.c_uint64 * ((end - start) // 8)).from_address(start)
    return not np.ctypeslib.as_array(words).any()


@pytest.mark.parametrize("watched", [True, False], ids=["meanwhile", "unwatched"])
def test_zero_pages_go_back_while_a_memset_of_zeros_runs(watched: bool) -> None:
    """The watch's thread hands back the pages a memset of zeros has passed while it runs, so the
    chunk is never all resident at once (the peak, VmHWM, reset before); unwatched, it is. Watched,
    up to three tries: on two cores loaded by the rest of the suite the watch's thread can be kept
    off the CPU for the whole memset (seen once in a full run: +181 MiB), which shows the scheduler,
    not the watch."""
    size = 256 * MIB
    for _ in range(3 if watched else 1):
        watch, memory, peak = _watched_memset(size, watched)
        if not watched or peak < size / 2:
            break
        memory.free()
    try:
        if not watched:
            assert peak > size * 0.95
            return
        assert watch.chunks == {memory.region}
        assert watch.released > size / 2
        assert peak < size / 2, f"peak +{peak / MIB:.0f} MiB for a {size / MIB:.0f} MiB memset"
        assert _resident_bytes(memory.region) < size / 2
        assert memory[8] == 0x2  # glibc's header (the size word's low byte: IS_MMAPPED) is kept
        assert _only_zeros(memory.pointer, memory.region.end)
    finally:
        memory.free()


def _watched_memset(size: int, watched: bool) -> tuple[ZeroPageWatch, Allocation, float]:
    """A chunk of `size` zeroed as llama.cpp's constructor does its KV streams (posix_memalign, then
    one memset of zeros over all of it, ctypes calls that run without the GIL), with a watch running
    or not; the watch, the chunk, and the process's peak growth meanwhile."""
    watch = ZeroPageWatch()
    return_freed_memory()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    base = _peak_bytes()
    with watch.meanwhile() if watched else contextlib.nullcontext():
        memory = Allocation(size)
    return watch, memory, _peak_bytes() - base


def test_a_watch_finds_only_chunks_mapped_after_it_and_keeps_their_data() -> None:
    """Chunks allocated before the watch are not its own; a chunk it finds keeps every non-zero
    byte through a release while nothing writes."""
    earlier = Allocation()
    watch = ZeroPageWatch()
    later = Allocation()
    try:
        later[7 * PAGE_BYTES + 100] = 0xA5
        watch.look()
        assert watch.chunks == {later.region}
        watch.release()
        assert watch.released == later.region.size - 2 * PAGE_BYTES  # all but the header and page 7
        assert later[7 * PAGE_BYTES + 100] == 0xA5
        assert _resident_bytes(earlier.region) == earlier.region.size
    finally:
        earlier.free()
        later.free()
