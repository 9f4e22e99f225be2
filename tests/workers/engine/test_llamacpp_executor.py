"""The llama.cpp backend on the real default GGUF model (one thread): continuous batching in one
llama_decode per step, each row its own KV stream (batched == solo), rows freed and reused, the
shared sampling step (structured outputs, logprobs), and the memory it takes."""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.workers.engine.conftest import EngineFactory
from workers.engine import GenerationRequest, RequestError, SamplingParams, StepStats
from workers.engine.config import DEFAULT_MODEL, EngineConfig
from workers.engine.continuous import TransformersEngine
from workers.engine.llamacpp_executor import BATCH_TOKENS, LlamaCppExecutor
from workers.engine.llamacpp_model import LlamaCppModel, binding, context_params, physical_cores
from workers.engine.loading import LoadedModel
from workers.engine.pages import PAGE_BYTES, ZeroPageWatch, return_freed_memory

pytestmark = pytest.mark.slow

PROMPTS = [
    "Hi!",
    "Name the three primary colors of paint, and nothing else.",
    "Explain in two sentences why the sky is blue during the day.",
    "Describe, step by step, how to make a cup of tea with loose leaves, a kettle and a teapot.",
]


def _chat(request_id: str, prompt: str, **params: Any) -> GenerationRequest:
    sampling = SamplingParams(**{"max_tokens": 16, **params})
    return GenerationRequest(request_id, sampling, messages=[{"role": "user", "content": prompt}])


def _wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _executor(engine: TransformersEngine) -> LlamaCppExecutor:
    executor = engine._executor
    assert isinstance(executor, LlamaCppExecutor)
    return executor


def test_a_short_job_joins_long_ones_and_a_canceled_row_is_reused(llamacpp_engine: EngineFactory) -> None:
    engine = llamacpp_engine(max_batch_size=3)
    solo = engine.submit(_chat("solo", PROMPTS[1], max_tokens=12, ignore_eos=True)).result(60)
    started = threading.Event()
    long_jobs = [
        engine.submit(
            GenerationRequest(
                f"long{i}",
                SamplingParams(max_tokens=400, ignore_eos=True),
                messages=[{"role": "user", "content": f"Tell me a very long story number {i}."}],
                on_output=lambda update: started.set(),
            )
        )
        for i in range(2)
    ]
    assert started.wait(60)
    short = engine.submit(_chat("short", PROMPTS[0], max_tokens=8, ignore_eos=True)).result(60)
    assert short.completion_tokens == 8 and short.batch_size == 3  # it ran beside both long jobs
    assert not any(job.done() for job in long_jobs)
    executor = _executor(engine)
    rows = {executor.seq_id(sequence) for sequence in list(executor._rows)}
    engine.cancel("long0")
    with pytest.raises(RequestError, match="cancel"):
        long_jobs[0].result(10)
    # The next job takes the freed row (its cells past the shared chat-template prefix dropped),
    # beside a long job, and matches solo.
    again = engine.submit(_chat("again", PROMPTS[1], max_tokens=12, ignore_eos=True)).result(60)
    assert again.batch_size == 2 and again.text == solo.text
    _wait_for(lambda: executor.rows == 1)
    assert {executor.seq_id(s) for s in executor._rows} < rows
    engine.cancel("long1")
    with pytest.raises(RequestError, match="cancel"):
        long_jobs[1].result(10)


def test_with_f16_cells_batched_greedy_output_equals_solo(llamacpp_engine: EngineFactory) -> None:
    """GENQ_LLAMACPP_KV_CELLS=f16 keeps what the engine guarantees: each row its own stream, so a
    job's greedy text batched beside others is its solo text."""
    engine = llamacpp_engine(max_batch_size=4, llamacpp_kv_cells="f16")
    solo = [engine.submit(_chat(f"solo{i}", p, max_tokens=12)).result(60).text for i, p in enumerate(PROMPTS)]
    batched = [engine.submit(_chat(f"batched{i}", p, max_tokens=12)) for i, p in enumerate(PROMPTS)]
    results = [future.result(60) for future in batched]
    assert [result.text for result in results] == solo
    assert max(result.batch_size for result in results) > 1


class _RecordingExecutor(LlamaCppExecutor):
    """The real executor; each llama_decode's seq_ids, in batch order, are kept for the test."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.batches: list[list[int]] = []

    def _forward(self, batch: Any) -> None:
        self.batches.append([batch.seq_id[index][0] for index in range(batch.n_tokens)])
        super()._forward(batch)


def _story(request_id: str, number: int, **hooks: Any) -> GenerationRequest:
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    messages = [{"role": "user", "content": f"Tell me a very long story number {number}."}]
    return GenerationRequest(request_id, params, messages=messages, **hooks)


def test_the_running_rows_stay_one_run_of_seq_ids_and_a_moved_row_computes_as_before(
    llamacpp_model: LlamaCppModel, model_cache: Path
) -> None:
    """llama.cpp runs a batch as one forward pass per run of consecutive seq_ids (one KV stream per
    row). A row that ends inside the run is filled by moving the last row there (its KV copied), and
    that sequence's text is still its solo text; a new job takes the seq_id after the run."""
    # Without the prefix cache, so that which seq_id a job takes depends on the run alone.
    config = EngineConfig(
        model=DEFAULT_MODEL, model_cache=model_cache, torch_threads=1, max_batch_size=3,
        llamacpp_prefix_cache=False,
    )  # fmt: skip
    executor = _RecordingExecutor(config, llamacpp_model)
    engine = TransformersEngine(config, executor=executor)
    engine.start()
    try:
        solo = engine.submit(_story("solo", 2)).result(60)
        outputs = [threading.Event() for _ in range(3)]
        jobs = [
            engine.submit(_story(f"long{i}", i, on_output=lambda _, event=outputs[i]: event.set()))
            for i in range(3)
        ]
        assert all(event.wait(60) for event in outputs)
        assert [executor.seq_id(s) for s in sorted(executor._rows, key=lambda s: s.request_id)] == [0, 1, 2]
        executor.batches.clear()
        engine.cancel("long1")  # seq_id 1, inside the run: long2 moves from 2 to 1
        with pytest.raises(RequestError, match="cancel"):
            jobs[1].result(10)
        short = engine.submit(_chat("short", PROMPTS[0], max_tokens=4, ignore_eos=True)).result(60)
        moved = jobs[2].result(60)
        assert executor.moves == 1
        assert moved.text == solo.text and moved.completion_tokens == 48
        assert short.batch_size == 3
        steps = [ids for ids in executor.batches if len(set(ids)) == len(ids) > 1]  # decodes, not prompts
        assert [0, 1] in steps and [0, 1, 2] in steps  # the move, then the new job after the run
        assert all(ids == list(range(ids[0], ids[0] + len(ids))) for ids in steps)
        jobs[0].result(60)
    finally:
        engine.shutdown(timeout=30)


def test_a_later_prompt_reuses_the_cells_of_a_released_row_and_computes_as_a_full_prefill(
    llamacpp_engine: EngineFactory,
) -> None:
    """The prefix cache: a released row keeps its KV cells (the prompt and all of the completion but
    its last token); a conversation's next turn, whose prompt starts with all of them, takes that
    row and prefills only the new tokens, and its logprobs and text equal those of an engine that
    prefilled it whole."""
    engine = llamacpp_engine(max_batch_size=4)
    executor = _executor(engine)
    first = engine.submit(_chat("first", PROMPTS[2], max_tokens=6, ignore_eos=True)).result(60)
    _wait_for(lambda: executor.rows == 0)  # a result is set a moment before its row is released
    assert [executor.cells(seq_id) for seq_id in range(4)] == [first.prompt_tokens + 5, 0, 0, 0]
    turn = [{"role": "user", "content": PROMPTS[2]}, {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And at night?"}]  # fmt: skip
    params = SamplingParams(max_tokens=12, logprobs=2)
    reused = engine.submit(GenerationRequest("turn", params, messages=turn)).result(60)
    cached = executor.cache_totals.cached_prompt_tokens
    assert cached >= first.prompt_tokens  # at least the first prompt's cells
    whole = llamacpp_engine(max_batch_size=4, llamacpp_prefix_cache=False)
    fresh = whole.submit(GenerationRequest("turn", params, messages=turn)).result(60)
    assert (reused.text, reused.logprobs) == (fresh.text, fresh.logprobs)
    assert _executor(whole).cache_totals.cached_prompt_tokens == 0
    _wait_for(lambda: _executor(whole).rows == 0)
    assert _executor(whole).cells(0) == 0  # off: a released row keeps nothing


def _verbatim(request_id: str, text: str, started: threading.Event) -> GenerationRequest:
    """A long job on a prompt without the chat template: it shares no cells with a conversation."""
    params = SamplingParams(max_tokens=400, ignore_eos=True)
    return GenerationRequest(
        request_id, params, prompt=text, template="none", on_output=lambda _: started.set()
    )


def test_a_conversation_whose_cells_lie_away_from_the_run_gets_a_copy_of_them(
    llamacpp_engine: EngineFactory,
) -> None:
    """A conversation's next turn finds its first turn's cells in a seq_id that is not beside the
    running ones: an empty seq_id beside the run gets a copy of that stream (far more shared tokens
    than a copy costs), the cells stay where they were, and the turn's logprobs and text equal those
    of an engine that prefilled it whole. Jobs that share nothing leave the conversation's cells alone."""
    engine = llamacpp_engine(max_batch_size=5)
    executor = _executor(engine)
    first = engine.submit(_chat("first", PROMPTS[2], max_tokens=6, ignore_eos=True)).result(60)
    _wait_for(lambda: executor.rows == 0)
    started = [threading.Event() for _ in range(3)]
    longs = [
        engine.submit(_verbatim(f"long{i}", f"Once upon a time, story {i}", started[i])) for i in range(3)
    ]
    assert all(event.wait(60) for event in started)
    assert sorted(executor.seq_id(s) for s in executor._rows) == [1, 2, 3]  # 0 keeps the conversation
    engine.cancel("long0")  # frees 1: the run is 2-3, and 0 lies away from it
    with pytest.raises(RequestError, match="cancel"):
        longs[0].result(30)
    turn = [{"role": "user", "content": PROMPTS[2]}, {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And at night?"}]  # fmt: skip
    params = SamplingParams(max_tokens=12, logprobs=2)
    reused = engine.submit(GenerationRequest("turn", params, messages=turn)).result(60)
    assert executor.cache_totals.cached_prompt_tokens >= first.prompt_tokens
    assert (executor.copies, executor.moves) == (1, 0)  # copied beside the run: nothing to move
    assert executor.cells(0) == first.prompt_tokens + 5  # and the first turn's cells are still there
    engine.cancel("long1")
    engine.cancel("long2")
    whole = llamacpp_engine(max_batch_size=5, llamacpp_prefix_cache=False)
    fresh = whole.submit(GenerationRequest("turn", params, messages=turn)).result(60)
    assert (reused.text, reused.logprobs) == (fresh.text, fresh.logprobs)


def test_scoring_a_prompt_prefills_all_of_it(llamacpp_engine: EngineFactory) -> None:
    engine = llamacpp_engine(max_batch_size=2)
    executor = _executor(engine)
    engine.submit(_chat("warm", PROMPTS[1], max_tokens=2)).result(60)
    scored = engine.submit(_chat("scored", PROMPTS[1], max_tokens=2, prompt_logprobs=1)).result(60)
    assert executor.cache_totals.cached_prompt_tokens == 0  # every position's logits are needed
    assert scored.prompt_logprobs is not None and len(scored.prompt_logprobs) == scored.prompt_tokens
    engine.submit(_chat("again", PROMPTS[1], max_tokens=2)).result(60)
    assert executor.cache_totals.cached_prompt_tokens == scored.prompt_tokens - 1  # all but the last


def test_the_time_inside_llama_decode_is_counted_within_the_runs_wall_time(
    llamacpp_engine: EngineFactory,
) -> None:
    """What bench/engine_reference.py splits a run's time by (llama.cpp's compute, genq's own work)."""
    engine = llamacpp_engine(max_batch_size=2)
    executor = _executor(engine)
    before, began = executor.decode_seconds, time.perf_counter()
    engine.submit(_chat("timed", PROMPTS[1], max_tokens=8, ignore_eos=True)).result(60)
    inside = executor.decode_seconds - before
    assert 0 < inside <= time.perf_counter() - began


def test_each_step_reports_what_the_prefix_cache_saved_kept_and_dropped(
    llamacpp_engine: EngineFactory,
) -> None:
    """What a worker exports as genq_prompt_tokens_cached_total, genq_prefix_cache_tokens and
    genq_prefix_cache_evictions_total (workers/worker.py): the steps' sums equal the executor's own
    counts, and the last step reports the cells the free rows keep."""
    steps: list[StepStats] = []
    engine = llamacpp_engine(max_batch_size=2, on_step=steps.append)
    executor = _executor(engine)
    first = engine.submit(_chat("first", PROMPTS[1], max_tokens=4, ignore_eos=True)).result(60)
    again = engine.submit(_chat("again", PROMPTS[1], max_tokens=4, ignore_eos=True)).result(60)
    _wait_for(lambda: executor.rows == 0 and steps[-1].cache.kept_tokens > 0)
    cached = executor.cache_totals.cached_prompt_tokens
    assert sum(step.cache.cached_prompt_tokens for step in steps) == cached
    assert cached == again.prompt_tokens - 1  # all of it but its last token
    assert (first.cached_prompt_tokens, again.cached_prompt_tokens) == (0, again.prompt_tokens - 1)
    assert sum(step.prefill_tokens for step in steps) == first.prompt_tokens + again.prompt_tokens
    assert steps[-1].cache.kept_tokens == sum(executor.cells(row) for row in range(2))
    assert not any(step.cache.evictions for step in steps)

    steps.clear()
    bounded = llamacpp_engine(max_batch_size=2, llamacpp_cache_tokens=1, on_step=steps.append)
    for index in range(3):
        bounded.submit(_chat(f"job{index}", PROMPTS[index], max_tokens=4, ignore_eos=True)).result(60)
    _wait_for(lambda: _executor(bounded).rows == 0 and sum(s.cache.evictions for s in steps) == 3)
    assert _executor(bounded).cache_totals.evictions == 3 and steps[-1].cache.kept_tokens == 0


def test_json_schema_output_is_valid_batched(llamacpp_engine: EngineFactory) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    text = json.dumps(schema)
    engine = llamacpp_engine(max_batch_size=4)
    futures = [
        engine.submit(
            _chat(f"j{i}", "Invent a person.", max_tokens=40, json_schema=text, temperature=0.8, seed=i)
        )
        for i in range(3)
    ]
    free = engine.submit(_chat("free", PROMPTS[0]))
    for future in futures:
        result = future.result(60)
        value = json.loads(result.text)  # bounded by the schema, so complete within max_tokens
        assert result.finish_reason == "stop"
        assert set(value) == {"name", "age"} and 0 <= value["age"] <= 150
    assert free.result(60).completion_tokens > 0


def test_logprobs_batched_equal_solo_and_near_transformers(
    llamacpp_engine: EngineFactory, default_model: LoadedModel
) -> None:
    engine = llamacpp_engine(max_batch_size=4)
    params: dict[str, Any] = {"max_tokens": 6, "logprobs": 3, "prompt_logprobs": 2, "frequency_penalty": 1.0}
    prompt = "The capital of France is"
    request = GenerationRequest("p", SamplingParams(**params), prompt=prompt, template="none")
    solo = engine.submit(request).result(60)
    crowd = [engine.submit(_chat(f"c{i}", p, max_tokens=12)) for i, p in enumerate(PROMPTS)]
    batched = engine.submit(GenerationRequest("q", request.params, prompt=request.prompt, template="none"))
    result = batched.result(60)
    for future in crowd:
        future.result(60)
    assert result.batch_size > 1
    assert (result.logprobs, result.prompt_logprobs) == (solo.logprobs, solo.prompt_logprobs)
    assert result.prompt_logprobs is not None and len(result.prompt_logprobs) == result.prompt_tokens
    # Q4_1 weights in both; llama.cpp rounds activations to 8 bits in its dot products: close, not equal.
    ids = default_model.tokenizer(request.prompt).input_ids
    import torch

    with torch.inference_mode():
        logits = default_model.model(torch.tensor([ids])).logits[0].float()
    reference = torch.log_softmax(logits, dim=-1)
    for position, entry in enumerate(result.prompt_logprobs[1:], start=1):
        assert entry.logprob == pytest.approx(float(reference[position - 1, entry.token_id]), abs=0.25)


def _status_mib(field: str) -> float:
    return int(Path("/proc/self/status").read_text().split(f"{field}:")[1].split()[0]) / 1024


def _rss_mib() -> float:
    return _status_mib("VmRSS")


#: Bytes per K or V element of each cell type: q8_0 holds 32 in 34 bytes.
CELL_BYTES = {"q8_0": 34 / 32, "f16": 2.0}


def _kv_mib(model: LlamaCppModel, cells: int, kind: str = "q8_0") -> float:
    """The size of llama.cpp's KV streams of cell type `kind` for `cells` cells of this model."""
    llama, handle = binding(), model.handle
    layers, heads_kv = llama.llama_model_n_layer(handle), llama.llama_model_n_head_kv(handle)
    head_dim = llama.llama_model_n_embd(handle) // llama.llama_model_n_head(handle)
    return float(layers * 2 * heads_kv * head_dim * cells * CELL_BYTES[kind] / 2**20)


@pytest.mark.serial  # the zero pages are handed back as the memset passes them: it needs the CPU
def test_a_16_row_engine_holds_the_kv_cells_it_wrote_and_no_copy_of_the_weights(
    llamacpp_model: LlamaCppModel, llamacpp_engine: EngineFactory
) -> None:
    """The memory a worker's engine takes beyond the mapped model: llama.cpp allocates and zeroes
    its 8-bit KV streams for every row up front, and their pages that hold only zeros go back to
    the kernel as the constructor's memset passes them and once the engine is warmed up
    (workers/engine/pages.py), so what stays resident is the cells written since and small
    compute buffers (all 383 MiB of streams stayed before), and the streams were never all
    resident at once (the peak, VmHWM, reached 383 MiB more before); the weights are never
    dequantized (fp32 would add ~520 MiB for this model's 135M parameters)."""
    kv_mib = _kv_mib(llamacpp_model, 16 * 2048)
    return_freed_memory()  # as the engine's start does: what earlier tests freed is not counted
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _rss_mib()
    engine = llamacpp_engine(max_batch_size=16, llamacpp_sequence_tokens=2048)
    peak = _status_mib("VmHWM") - before
    released_mib = _executor(engine).released_bytes / 2**20
    for future in [engine.submit(_chat(f"m{i}", PROMPTS[i % 4], max_tokens=8)) for i in range(8)]:
        future.result(60)
    grown = _rss_mib() - before
    print(f"a 16-row llama.cpp engine: +{grown:.0f} MiB resident, +{peak:.0f} MiB at its peak "
          f"(KV streams {kv_mib:.0f} MiB, {released_mib:.0f} MiB handed back)")  # fmt: skip
    assert kv_mib * 0.95 < released_mib
    assert grown < kv_mib / 4
    assert peak < kv_mib / 2


@pytest.mark.parametrize("cells", ["q8_0", "f16"])
def test_creating_a_context_writes_nothing_but_zeros_into_the_memory_it_maps(
    llamacpp_model: LlamaCppModel, model_cache: Path, cells: str
) -> None:
    """What makes handing back zero pages while llama.cpp creates a context safe (ZeroPageWatch
    .meanwhile in LlamaCppExecutor.prepare): the constructor writes nothing but zeros into the
    large chunks it maps (the KV streams, compute buffers), so a zero page handed back while it
    runs loses no write. Checked here on a context created the engine's way with no page handed
    back: every chunk holds only zeros past its first page (glibc's header). A llama.cpp that
    initialises its buffers otherwise fails this test, and must not be run with that release. For
    each K/V cell type (GENQ_LLAMACPP_KV_CELLS), whose streams take the size that type has."""
    config = EngineConfig(model=DEFAULT_MODEL, model_cache=model_cache, torch_threads=1, max_batch_size=4)
    config = replace(config, llamacpp_sequence_tokens=2048, llamacpp_kv_cells=cells)
    executor = LlamaCppExecutor(config, llamacpp_model)
    llama = binding()
    watch = ZeroPageWatch()
    params = context_params(config, executor.threads, BATCH_TOKENS)
    context = llama.llama_init_from_model(llamacpp_model.handle, params)
    try:
        watch.look()
        mapped_mib = sum(chunk.size for chunk in watch.chunks) / 2**20
        kv_mib = _kv_mib(llamacpp_model, 4 * 2048, cells)
        assert kv_mib < mapped_mib < kv_mib + 128  # streams of that type, and compute buffers (~100 MiB)
        for chunk in watch.chunks:
            past_header = chunk.start + PAGE_BYTES
            words = (ctypes.c_uint64 * ((chunk.end - past_header) // 8)).from_address(past_header)
            assert not np.ctypeslib.as_array(words).any(), f"non-zero bytes in {chunk}"
    finally:
        llama.llama_free(context)


def test_native_memory_freed_before_the_kv_cache_goes_back_to_the_kernel() -> None:
    """60 MB of small native blocks freed below one still held (so glibc's automatic trim of the
    heap's top cannot return them) stay resident until return_freed_memory()."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(1024) for _ in range(60_000)]
    for block in blocks:
        ctypes.memset(block, 1, 1024)
    kept = libc.malloc(1024)
    for block in blocks:
        libc.free(block)
    held = _rss_mib()
    return_freed_memory()
    assert held - _rss_mib() > 40
    libc.free(kept)


def test_the_default_threads_are_the_physical_cores() -> None:
    """One llama.cpp thread per physical core this process may use (SMT siblings count once)."""
    assert 1 <= physical_cores() <= len(os.sched_getaffinity(0))
    executor = LlamaCppExecutor(EngineConfig(model=DEFAULT_MODEL))
    assert executor.threads == physical_cores()
