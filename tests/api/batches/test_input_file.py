"""Reading a batch's input file at its cursor (api/batches/input_file.py): the lines taken, the
blank ones stepped over, and a cursor that resumes exactly where the last read stopped."""

from __future__ import annotations

from pathlib import Path

from api.batches.filestore import LocalStorage
from api.batches.input_file import input_gone, take_lines
from shared.batches import BatchStatus

CONTENT = b'{"n": 1}\n\n{"n": 3}\n{"n": 4}\n{"n": 5}'


def test_lines_are_taken_from_the_cursor_stepping_over_blank_ones(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put("input", [CONTENT])
    first = take_lines(storage, "input", 0, 0, 2, 1024)
    assert [(number, raw) for number, raw, _ in first.lines] == [(1, b'{"n": 1}\n'), (3, b'{"n": 3}\n')]
    assert (first.end_line, first.at_end) == (3, False)
    # Each line's offset is where it starts: a feeder that stops before it resumes there.
    assert [
        isinstance(raw, bytes) and CONTENT[offset:].startswith(raw) for _, raw, offset in first.lines
    ] == [
        True,
        True,
    ]
    rest = take_lines(storage, "input", first.end_offset, first.end_line, 10, 1024)
    assert [(number, raw) for number, raw, _ in rest.lines] == [(4, b'{"n": 4}\n'), (5, b'{"n": 5}')]
    assert (rest.end_offset, rest.end_line, rest.at_end) == (len(CONTENT), 5, True)


def test_a_read_at_the_end_takes_nothing_and_says_so(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.put("input", [CONTENT])
    taken = take_lines(storage, "input", len(CONTENT), 5, 10, 1024)
    assert (taken.lines, taken.end_offset, taken.at_end) == ([], len(CONTENT), True)


def test_a_gone_input_fails_the_batch_naming_the_file() -> None:
    ending = input_gone({"input_file_id": "file-abc"}, "is gone")
    assert ending.status is BatchStatus.FAILED
    assert ending.errors == [
        {"code": "file_not_found", "message": "the input file file-abc is gone", "param": "input_file_id",
         "line": None}
    ]  # fmt: skip
