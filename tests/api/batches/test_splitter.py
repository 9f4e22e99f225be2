"""Splitting a batch input file into lines (api/batches/splitter.py) through the real local file
storage: a line over the cap is read past without ever being held (a reader that records the
memory the split holds each time it asks for the next chunk), and the split does linear work on a
file without a newline and on a long line in small chunks (bytes copied counted, not timed)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

from api.batches.filestore import CHUNK_BYTES, LocalStorage
from api.batches.input_file import take_lines
from api.batches.splitter import LineSplitter, TooLong, line_size, split_lines

CAP = 64 << 10


class HeldMemory:
    """The real storage's chunks, re-cut to `chunk_bytes`; before handing on each one it records
    the memory the reader of the stream holds (tracemalloc's current, above where it started)."""

    def __init__(self, storage: LocalStorage, chunk_bytes: int) -> None:
        self._storage = storage
        self._chunk_bytes = chunk_bytes
        self.chunks = 0
        self.held_max = 0

    def read(self, name: str, offset: int = 0) -> Iterator[bytes]:
        return self._chunks(name, offset)

    def _chunks(self, name: str, offset: int) -> Iterator[bytes]:
        start = tracemalloc.get_traced_memory()[0]
        for big in self._storage.read(name, offset):
            for at in range(0, len(big), self._chunk_bytes):
                self.held_max = max(self.held_max, tracemalloc.get_traced_memory()[0] - start - len(big))
                self.chunks += 1
                yield big[at : at + self._chunk_bytes]

    def put(self, name: str, chunks: object) -> int:
        raise NotImplementedError

    def delete(self, name: str) -> None:
        raise NotImplementedError


def test_lines_keep_their_bytes_across_chunks() -> None:
    chunks = [b'{"a"', b':1}\n{"b":2}\n\n{"c"', b":3}"]
    lines = list(split_lines(chunks, CAP))
    assert lines == [b'{"a":1}\n', b'{"b":2}\n', b"\n", b'{"c":3}']
    assert sum(map(line_size, lines)) == sum(map(len, chunks))


def test_a_line_at_the_cap_is_kept_and_one_byte_more_is_not() -> None:
    at_cap, over = b"a" * (CAP - 1) + b"\n", b"b" * CAP + b"\n"
    assert list(split_lines([at_cap[:10], at_cap[10:], over, b"tail"], CAP)) == [
        at_cap,
        TooLong(CAP + 1),
        b"tail",
    ]
    assert list(split_lines([b"c" * (CAP + 5)], CAP)) == [TooLong(CAP + 5)]  # the last line, no newline


def test_an_over_long_line_is_refused_without_being_held(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    good = b'{"custom_id": "a"}\n'
    long_line = b'{"custom_id": "b", "pad": "' + b"x" * (8 << 20) + b'"}\n'
    storage.put("input", [good, long_line, good])
    reader = HeldMemory(storage, 16 << 10)
    tracemalloc.start()
    try:
        taken = take_lines(reader, "input", 0, 0, 10, CAP)
    finally:
        tracemalloc.stop()
    assert [(number, raw) for number, raw, _ in taken.lines] == [
        (1, good), (2, TooLong(len(long_line))), (3, good)
    ]  # fmt: skip
    assert [offset for _, _, offset in taken.lines] == [0, len(good), len(good) + len(long_line)]
    assert taken.at_end and taken.end_offset == 2 * len(good) + len(long_line)
    # The 8 MiB line was never held: at most the cap of it (and one storage chunk) at a time.
    assert reader.held_max < CAP + CHUNK_BYTES


def test_a_file_without_a_newline_is_split_in_linear_work(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put("input", [b"y" * (16 << 20)])
    reader = HeldMemory(storage, 16 << 10)
    splitter = LineSplitter(CAP)
    assert list(splitter.lines(reader.read("input"))) == [TooLong(16 << 20)]
    assert reader.chunks == (16 << 20) // (16 << 10)  # each chunk read once
    assert splitter.held_max <= CAP and splitter.copied <= CAP


def test_a_long_line_in_small_chunks_is_copied_a_bounded_number_of_times() -> None:
    line = b"z" * (CAP - 1) + b"\n"
    chunks = [line[at : at + 64] for at in range(0, len(line), 64)] * 8
    splitter = LineSplitter(CAP)
    assert list(splitter.lines(chunks)) == [line] * 8
    assert splitter.copied <= 2 * len(line) * 8
