"""Splitting a batch input file's stream of chunks into lines, with a cap on a line's length.

A line over the cap is read past, never held: the splitter keeps at most the cap of an unfinished
line (plus the chunk being read) and hands on a `TooLong` marker with the line's length in its
place, so validation refuses it as `line_too_long` without parsing it and a reader's byte offset
still adds up. A line is gathered as a list of pieces joined once, so the work is linear in the
bytes read, whatever the chunk size and however long the line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TooLong:
    """A line longer than the cap: only its length (with its newline, if any) is kept."""

    size: int


#: One line of the file: its bytes (with its newline; the last may lack one), or a TooLong.
Line = bytes | TooLong


def line_size(line: Line) -> int:
    """The bytes the line takes in the file."""
    return line.size if isinstance(line, TooLong) else len(line)


class LineSplitter:
    """Splits chunks into lines of at most `max_bytes`; counts what it held and copied, so a test
    can check the bound and the linear work without a clock."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        #: Most bytes of one unfinished line held at once (the cap bounds it).
        self.held_max = 0
        #: Bytes copied out of the chunks: each byte of a line kept is copied at most twice.
        self.copied = 0
        self._pieces: list[bytes] = []
        self._held = 0
        self._size = 0

    def lines(self, chunks: Iterable[bytes]) -> Iterator[Line]:
        """The lines of the stream, each with its newline; their sizes add up to the bytes read."""
        for chunk in chunks:
            start = 0
            while (end := chunk.find(b"\n", start)) != -1:
                yield self._end_line(chunk, start, end + 1)
                start = end + 1
            if start < len(chunk):
                self._keep(chunk, start, len(chunk))
        if self._size:
            yield self._end_line(b"", 0, 0)

    def _keep(self, chunk: bytes, start: int, stop: int) -> None:
        """Hold the start of an unfinished line, or only count it once it is over the cap."""
        self._size += stop - start
        if self._size > self.max_bytes:
            self._pieces.clear()
            self._held = 0
            return
        self._pieces.append(chunk[start:stop])
        self._held += stop - start
        self.copied += stop - start
        self.held_max = max(self.held_max, self._held)

    def _end_line(self, chunk: bytes, start: int, stop: int) -> Line:
        size = self._size + stop - start
        line: Line
        if size > self.max_bytes:
            line = TooLong(size)
        elif self._pieces:
            line = b"".join([*self._pieces, memoryview(chunk)[start:stop]])
        else:
            line = chunk[start:stop]
        if isinstance(line, bytes):
            self.copied += len(line)
        self._pieces.clear()
        self._held = self._size = 0
        return line


def split_lines(chunks: Iterable[bytes], max_bytes: int) -> Iterator[Line]:
    """The lines of a stream of chunks, those over `max_bytes` as TooLong."""
    return LineSplitter(max_bytes).lines(chunks)
