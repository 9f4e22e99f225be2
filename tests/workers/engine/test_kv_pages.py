"""The KV streams' pages past the cells each row holds go back to the kernel (kv_pages.py): the
layout's arithmetic, and on the real default GGUF model under llama.cpp that the layout is found,
that cells sit at their positions after prefix reuse, copies and moves (what handing back the rest
relies on), that nothing past them stays resident, and that outputs are unchanged."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from tests.workers.engine.conftest import EngineFactory
from tests.workers.engine.test_llamacpp_executor import _executor, _verbatim, _wait_for
from workers.engine import GenerationRequest, RequestError, SamplingParams
from workers.engine.kv_pages import StreamLayout, in_place, row_bytes
from workers.engine.pages import PAGE_BYTES, Region, resident_bytes


def test_the_pages_past_a_cell_are_the_whole_pages_of_that_streams_slice_in_every_tensor() -> None:
    layout = StreamLayout(base=0x10000 + 64, tensors=3, streams=4, cells=2048, row_bytes=204)
    assert layout.size == 3 * 4 * 2048 * 204
    for cell in (0, 1, 100, 2047):
        regions = layout.pages_past(2, cell)
        assert len(regions) == 3 if cell < 2000 else len(regions) <= 3
        for tensor, region in enumerate(regions):
            first, end = layout.address(tensor, 2, cell), layout.address(tensor, 3, 0)
            assert region.start % PAGE_BYTES == 0 and region.end % PAGE_BYTES == 0
            assert first <= region.start < first + PAGE_BYTES  # no page holding an earlier cell
            assert end - PAGE_BYTES < region.end <= end  # nor one holding the next stream's first
    assert layout.pages_past(2, 2048) == []
    assert layout.pages_past(3, 0)[-1].end <= layout.base + layout.size


def test_a_cells_bytes_follow_ggmls_row_sizes() -> None:
    assert row_bytes("q8_0", 192) == 204  # 6 blocks of 32 values, 34 bytes each
    assert row_bytes("f16", 192) == 384
    with pytest.raises(ValueError, match="q4_0"):
        row_bytes("q4_0", 192)


@pytest.mark.slow
@pytest.mark.parametrize("cells", ["q8_0", "f16"])
def test_the_streams_layout_is_found_on_the_pinned_llama_cpp(
    llamacpp_engine: EngineFactory, cells: str
) -> None:
    engine = llamacpp_engine(max_batch_size=4, llamacpp_kv_cells=cells)  # 4 x 2048 cells: ~100 MB in q8_0
    pages = _executor(engine).kv_streams.pages
    assert pages is not None, "the KV streams' layout was not confirmed: none of their pages is handed back"
    assert (pages.layout.tensors, pages.layout.streams, pages.layout.cells) == (60, 4, 2048)
    # Streams too small to be a mapping of their own (pages.ARENA_MAX_BYTES) are not looked for.
    assert (
        _executor(llamacpp_engine(max_batch_size=2, llamacpp_sequence_tokens=256)).kv_streams.pages is None
    )  # 6 MB


#: A system prompt every job shares (its cells are reused, or copied between streams), then short
#: questions; max_tokens varies so that rows end inside the run and the others move.
SYSTEM = "You are a terse assistant. Answer in at most one sentence, and never use lists."
JOBS = [("Name a color.", 3), ("Count to ten.", 20), ("Why is the sea salty?", 7), ("Say hi.", 2)] * 3


def _job(index: int, question: str, tokens: int) -> GenerationRequest:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{index}. {question}"}]
    return GenerationRequest(
        f"j{index}", SamplingParams(max_tokens=tokens, ignore_eos=True), messages=messages
    )


@pytest.mark.slow
def test_after_reuse_copies_and_moves_only_the_cells_held_are_resident_and_outputs_are_unchanged(
    llamacpp_engine: EngineFactory,
) -> None:
    """Cell i of a row holds position i (checked against llama.cpp's own serialization of every row
    that holds cells), nothing past a row's cells is resident (a copy used to leave the whole
    destination stream resident, and a dropped suffix its pages), and each job's tokens equal its
    solo run's, so no page a row reads was handed back."""
    solo_engine = llamacpp_engine(max_batch_size=1, llamacpp_prefix_cache=False)
    solo = [solo_engine.submit(_job(i, *job)).result(60).text for i, job in enumerate(JOBS)]
    engine = llamacpp_engine(max_batch_size=4, llamacpp_sequence_tokens=2048)
    executor = _executor(engine)
    first = engine.submit(_job(0, *JOBS[0])).result(60).text  # its row keeps the system prompt ...
    # ... which the next prompt gets a copy of, in an empty row, since the rest would overwrite it.
    futures = [engine.submit(_job(i, *job)) for i, job in enumerate(JOBS) if i]
    assert [first] + [future.result(60).text for future in futures] == solo
    _wait_for(lambda: executor.rows == 0)  # the last rows released: their cells settled
    assert executor.moves and executor.copies and executor.cache_totals.cached_prompt_tokens
    pages = executor.kv_streams.pages
    assert pages is not None
    layout = pages.layout
    holding = [row for row in range(4) if executor.cells(row) >= 2]
    assert holding, "the prefix cache keeps the finished rows' cells"
    assert in_place(layout, executor.kv_streams.serialized, executor.cells, holding)
    # The check can fail: a layout one cell off, or with the streams' order reversed, is refused.
    shifted = replace(layout, base=layout.base + layout.row_bytes)
    assert not in_place(shifted, executor.kv_streams.serialized, executor.cells, holding)
    reversed_rows = {row: 3 - row for row in range(4)}
    assert not in_place(
        layout, lambda row: executor.kv_streams.serialized(reversed_rows[row]), executor.cells, holding
    )
    past = [region for row in range(4) for region in layout.pages_past(row, executor.cells(row))]
    assert sum(map(resident_bytes, past)) == 0
    kv = Region(layout.base // PAGE_BYTES * PAGE_BYTES, layout.base + layout.size)
    held_bytes = sum(executor.cells(row) for row in range(4)) * layout.tensors * layout.row_bytes
    # Each tensor's slice of each stream may share a page with its neighbours at both ends.
    assert resident_bytes(kv) <= held_bytes + layout.tensors * 4 * 2 * PAGE_BYTES
    assert pages.released > 0


@pytest.mark.slow
def test_past_the_cache_bound_the_oldest_rows_cells_are_dropped_and_their_pages_handed_back(
    llamacpp_engine: EngineFactory,
) -> None:
    engine = llamacpp_engine(max_batch_size=4, llamacpp_cache_tokens=60)
    executor = _executor(engine)
    for index, job in enumerate(JOBS[:4]):  # one at a time: each finished row keeps ~40 cells
        engine.submit(_job(index, *job)).result(60)
        _wait_for(lambda: executor.rows == 0)
    assert executor.cache_totals.evictions >= 2
    assert sum(executor.cells(row) for row in range(4)) <= 60 + 40  # the last job's row, and the bound
    pages = executor.kv_streams.pages
    assert pages is not None
    empty = [row for row in range(4) if executor.cells(row) == 0]
    assert len(empty) >= 2
    assert sum(resident_bytes(region) for row in empty for region in pages.layout.pages_past(row, 0)) == 0


@pytest.mark.slow
def test_a_copy_longer_than_the_prompt_that_takes_it_leaves_no_pages_past_its_cells(
    llamacpp_engine: EngineFactory,
) -> None:
    """A prompt that shares only the start of a row's cells, when that row lies away from the run,
    gets a copy of all of them in a row beside it and drops the rest: the pages of the rest go
    back too, once its prompt is in."""
    engine = llamacpp_engine(max_batch_size=5)
    executor = _executor(engine)
    engine.submit(_job(0, "Count to a hundred.", 200)).result(60)  # row 0: its prompt + 199 cells
    started = [threading.Event() for _ in range(3)]
    longs = [engine.submit(_verbatim(f"long{i}", f"Story {i}", started[i])) for i in range(3)]
    assert all(event.wait(60) for event in started)
    engine.cancel("long0")  # the run is 2-3: row 0 lies away from it
    again = engine.submit(_job(0, "Count to a hundred.", 2)).result(60)
    assert executor.copies == 1 and again.cached_prompt_tokens == again.prompt_tokens - 1
    for name in ("long1", "long2"):
        engine.cancel(name)
    for future in longs:
        with pytest.raises(RequestError):
            future.result(30)
    _wait_for(lambda: executor.rows == 0)
    pages = executor.kv_streams.pages
    assert pages is not None
    past = [region for row in range(5) for region in pages.layout.pages_past(row, executor.cells(row))]
    assert sum(map(resident_bytes, past)) == 0
