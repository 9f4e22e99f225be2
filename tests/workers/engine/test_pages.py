"""Zero pages handed back to the kernel (workers/engine/pages.py), on real mappings of this process:
the pages that held only zeros stop being resident and still read as zeros, the others keep
their data, and only new mappings that are one allocation each are ever candidates."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.engine.pages import (
    PAGE_BYTES,
    Region,
    anonymous_mappings,
    new_large_regions,
    release_zero_pages,
)

MIB = 1 << 20
PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


def _region_of(memory: mmap.mmap) -> Region:
    view = ctypes.c_char.from_buffer(memory)
    start = ctypes.addressof(view)
    del view  # a live export would keep the mapping from closing
    return Region(start, start + len(memory))


def _resident_bytes(region: Region) -> int:
    """Rss of the mapping that is exactly `region` (/proc/self/smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    span = f"{region.start:x}-{region.end:x} "
    index = next(index for index, line in enumerate(lines) if line.startswith(span))
    rss = next(entry for entry in lines[index + 1 :] if entry.startswith("Rss:"))
    return int(rss.split()[1]) * 1024


class Guarded:
    """96 MiB of private anonymous memory between two inaccessible pages, so that the kernel cannot
    merge it with a neighbour (whose pages would count in its Rss); indexed from its first page."""

    def __init__(self, size: int = 96 * MIB) -> None:
        self.memory = mmap.mmap(-1, size + 2 * PAGE_BYTES, flags=PRIVATE)
        whole = _region_of(self.memory)
        mprotect = ctypes.CDLL(None).mprotect
        mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        for guard in (whole.start, whole.end - PAGE_BYTES):
            assert mprotect(guard, PAGE_BYTES, 0) == 0  # PROT_NONE
        self.region = Region(whole.start + PAGE_BYTES, whole.end - PAGE_BYTES)

    def __getitem__(self, index: int | slice) -> int | bytes:
        if isinstance(index, slice):
            return self.memory[index.start + PAGE_BYTES : index.stop + PAGE_BYTES]
        return self.memory[index + PAGE_BYTES]

    def __setitem__(self, index: int, value: int) -> None:
        self.memory[index + PAGE_BYTES] = value


@pytest.fixture
def private_mapping() -> Iterator[tuple[Guarded, Region]]:
    """Every page written with zeros (resident), as llama.cpp's KV buffer is after its constructor."""
    before = anonymous_mappings()
    memory = Guarded()
    assert new_large_regions(before) == {memory.region}
    for page in range(0, memory.region.size, PAGE_BYTES):
        memory[page] = 0
    assert _resident_bytes(memory.region) == memory.region.size
    yield memory, memory.region
    memory.memory.close()


def test_pages_holding_only_zeros_go_back_and_still_read_as_zeros(
    private_mapping: tuple[Guarded, Region],
) -> None:
    memory, region = private_mapping
    written = [3, 4, 1000, region.size // PAGE_BYTES - 1]  # pages with data, the last one included
    for page in written:
        memory[page * PAGE_BYTES + 7] = 0x5A
    resident = _resident_bytes(region)

    released = release_zero_pages({region})

    assert released == region.size - len(written) * PAGE_BYTES
    assert resident - _resident_bytes(region) == released
    for page in written:  # the data stayed
        assert memory[page * PAGE_BYTES + 7] == 0x5A
    assert memory[0 : 3 * PAGE_BYTES] == b"\0" * (3 * PAGE_BYTES)  # a released page reads as zeros
    assert resident - _resident_bytes(region) == released  # and reading it takes no memory
    memory[5 * PAGE_BYTES] = 1  # writing makes that page resident again, with the value written
    assert memory[5 * PAGE_BYTES] == 1
    assert resident - _resident_bytes(region) == released - PAGE_BYTES


def test_a_second_release_finds_the_same_zeros(private_mapping: tuple[Guarded, Region]) -> None:
    memory, region = private_mapping
    memory[0] = 1
    assert release_zero_pages({region}) == region.size - PAGE_BYTES
    assert release_zero_pages({region}) == region.size - PAGE_BYTES  # still zeros, still released
    assert memory[0] == 1


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


def test_only_the_new_addresses_of_a_merged_mapping_are_new() -> None:
    """The kernel merges a new mapping into an adjacent one with the same flags; the earlier one's
    pages (which others may be writing) are not part of the new region."""
    before = anonymous_mappings()
    memory = mmap.mmap(-1, 200 * MIB, flags=PRIVATE)
    region = _region_of(memory)
    older = [*before, Region(region.start, region.start + 100 * MIB)]  # as if mapped earlier
    try:
        assert new_large_regions(older) == {Region(region.start + 100 * MIB, region.end)}
    finally:
        memory.close()


def test_a_region_no_longer_mapped_is_skipped() -> None:
    memory = mmap.mmap(-1, 96 * MIB, flags=PRIVATE)
    region = _region_of(memory)
    memory.close()  # its owner freed it: reading it now would be a segmentation fault
    assert release_zero_pages({region}) == 0
