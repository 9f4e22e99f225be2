"""The llama.cpp backend on the real default GGUF model (one thread): continuous batching in one
llama_decode per step, rows freed and reused, the prefix cache, the shared sampling step
(structured outputs, logprobs), and the memory it takes; in the batch-invariant layout (a KV stream
per row), batched output equals solo output token for token, and in the default's shared KV cache
it stays near it."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.workers.engine.conftest import EngineFactory
from workers.engine import GenerationRequest, RequestError, SamplingParams, StepStats
from workers.engine.config import DEFAULT_MODEL, EngineConfig
from workers.engine.llamacpp.executor import SCORED_TOKENS, LlamaCppExecutor
from workers.engine.llamacpp.model import LlamaCppModel, binding, physical_cores
from workers.engine.local import LocalEngine
from workers.engine.torch.loading import LoadedModel

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


def _executor(engine: LocalEngine) -> LlamaCppExecutor:
    executor = engine._executor
    assert isinstance(executor, LlamaCppExecutor)
    return executor


#: The layout in which batched output equals solo output token for token (workers/engine/llamacpp/context.py).
INVARIANT: dict[str, Any] = {"llamacpp_batch_invariant": True}


def test_a_short_job_joins_long_ones_and_a_canceled_row_is_reused(llamacpp_engine: EngineFactory) -> None:
    engine = llamacpp_engine(max_batch_size=3, **INVARIANT)
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
    """GENQ_LLAMACPP_KV_CELLS=f16 keeps what the batch-invariant layout guarantees: each row its own
    stream, so a job's greedy text batched beside others is its solo text."""
    engine = llamacpp_engine(max_batch_size=4, llamacpp_kv_cells="f16", **INVARIANT)
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
    """With a KV stream per row, llama.cpp runs a batch as one forward pass per run of consecutive
    seq_ids. A row that ends inside the run is filled by moving the last row there (its KV copied), and
    that sequence's text is still its solo text; a new job takes the seq_id after the run."""
    # Without the prefix cache, so that which seq_id a job takes depends on the run alone.
    config = EngineConfig(
        model=DEFAULT_MODEL, model_cache=model_cache, torch_threads=1, max_batch_size=3,
        llamacpp_prefix_cache=False, llamacpp_batch_invariant=True,
    )  # fmt: skip
    executor = _RecordingExecutor(config, llamacpp_model)
    engine = LocalEngine(config, executor=executor)
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
    prefilled it whole (its cells in position order: in either layout here)."""
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
    """With a KV stream per row, a conversation's next turn finds its first turn's cells in a seq_id
    that is not beside the running ones: an empty seq_id beside the run gets a copy of that stream
    (far more shared tokens than a copy costs), the cells stay where they were, and the turn's
    logprobs and text equal those of an engine that prefilled it whole. Jobs that share nothing
    leave the conversation's cells alone."""
    engine = llamacpp_engine(max_batch_size=5, **INVARIANT)
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
    whole = llamacpp_engine(max_batch_size=5, llamacpp_prefix_cache=False, **INVARIANT)
    fresh = whole.submit(GenerationRequest("turn", params, messages=turn)).result(60)
    assert (reused.text, reused.logprobs) == (fresh.text, fresh.logprobs)


def test_in_the_shared_cache_a_prompt_sharing_a_prefix_gets_those_cells_and_leaves_the_rest(
    llamacpp_engine: EngineFactory,
) -> None:
    """The default layout's prefix cache: a new conversation shares only the chat template's system
    prompt with a released row's cells; an empty seq_id gets a copy of them (llama.cpp marks the
    same cells, no data moves), the released row keeps its conversation, and the new job computes as
    an engine that prefilled it whole (its cells in position order here)."""
    engine = llamacpp_engine(max_batch_size=4)
    executor = _executor(engine)
    first = engine.submit(_chat("first", PROMPTS[2], max_tokens=6, ignore_eos=True)).result(60)
    _wait_for(lambda: executor.rows == 0)
    params = SamplingParams(max_tokens=12, logprobs=2)
    other = [{"role": "user", "content": PROMPTS[3]}]
    shared = engine.submit(GenerationRequest("other", params, messages=other)).result(60)
    assert executor.copies == 1 and 8 < shared.cached_prompt_tokens < first.prompt_tokens
    _wait_for(lambda: executor.rows == 0)
    assert executor.cells(0) == first.prompt_tokens + 5  # the first conversation's cells stay
    whole = llamacpp_engine(max_batch_size=4, llamacpp_prefix_cache=False)
    fresh = whole.submit(GenerationRequest("other", params, messages=other)).result(60)
    assert (shared.text, shared.logprobs) == (fresh.text, fresh.logprobs)


@pytest.mark.parametrize("invariant", [True, False], ids=["batch-invariant", "shared"])
def test_after_other_rows_come_and_go_a_job_computes_as_alone_exactly_when_batch_invariant(
    llamacpp_engine: EngineFactory, invariant: bool
) -> None:
    """A job decodes beside a long one that is then cancelled, and goes on alone. With a stream per
    row its cells stay in position order, and its tokens and logprobs equal its solo run's. In the
    default's shared cache its next cells go where the cancelled job's were, before its own, and
    attention sums them in that order: its logprobs stay near its solo run's (as near as llama.cpp's
    are to transformers') until a greedy token may differ."""
    engine = llamacpp_engine(max_batch_size=2, llamacpp_prefix_cache=False, output_interval_s=0.0,
                             llamacpp_batch_invariant=invariant)  # fmt: skip
    prompt = PROMPTS[2]
    solo = engine.submit(_chat("solo", prompt, max_tokens=96, ignore_eos=True, logprobs=1)).result(60)
    long_outputs: list[Any] = []
    params = SamplingParams(max_tokens=1000, ignore_eos=True)
    long = engine.submit(
        GenerationRequest("long", params, prompt="Once upon a time", on_output=long_outputs.append)
    )
    _wait_for(lambda: len(long_outputs) >= 200, timeout=60)  # its cells lie first in the cache
    job_outputs: list[Any] = []
    request = _chat("job", prompt, max_tokens=96, ignore_eos=True, logprobs=1)
    job = engine.submit(replace(request, on_output=job_outputs.append))
    _wait_for(lambda: len(job_outputs) >= 8, timeout=60)
    engine.cancel("long")
    with pytest.raises(RequestError, match="cancel"):
        long.result(30)
    result = job.result(60)
    assert result.batch_size == 2 and result.logprobs is not None and solo.logprobs is not None
    if invariant:
        assert (result.text, result.logprobs) == (solo.text, solo.logprobs)
        return
    for mine, alone in zip(result.logprobs, solo.logprobs, strict=True):
        assert mine.logprob == pytest.approx(alone.logprob, abs=0.25)
        if mine.token_id != alone.token_id:
            break


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
    engine = llamacpp_engine(max_batch_size=4, **INVARIANT)
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


def test_a_long_prompt_is_scored_a_chunk_at_a_time_near_transformers_in_bounded_memory(
    llamacpp_engine: EngineFactory, default_model: LoadedModel
) -> None:
    """Scoring a prompt (prompt_logprobs: what lm-eval's loglikelihood requests ask) needs every
    position's logits: they come SCORED_TOKENS positions a llama_decode, so llama.cpp's logits
    buffers and numpy's copies hold a chunk's rows of the vocabulary, not the prompt's (a 600-token
    prompt took ~675 MiB more at its peak when they held all of it); the scores across the chunks'
    boundaries stay near transformers' on the same weights."""
    engine = llamacpp_engine(max_batch_size=2)
    text = " ".join(PROMPTS * 12)  # ~600 tokens
    params = SamplingParams(max_tokens=1, prompt_logprobs=1)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _rss_mib()
    result = engine.submit(GenerationRequest("scored", params, prompt=text, template="none")).result(120)
    peak = _status_mib("VmHWM") - before
    assert result.prompt_tokens > 8 * SCORED_TOKENS and peak < 128
    assert result.prompt_logprobs is not None and len(result.prompt_logprobs) == result.prompt_tokens
    ids = default_model.tokenizer(text).input_ids
    import torch

    with torch.inference_mode():
        logits = default_model.model(torch.tensor([ids])).logits[0].float()
    reference = torch.log_softmax(logits, dim=-1)
    for position, entry in enumerate(result.prompt_logprobs[1:], start=1):
        expected = float(reference[position - 1, entry.token_id])
        assert entry.token_id == ids[position]
        assert entry.logprob == pytest.approx(expected, abs=0.25, rel=0.05)  # unlikely tokens drift more


def _status_mib(field: str) -> float:
    return int(Path("/proc/self/status").read_text().split(f"{field}:")[1].split()[0]) / 1024


def _rss_mib() -> float:
    return _status_mib("VmRSS")


#: Bytes per K or V element of each cell type: q8_0 holds 32 in 34 bytes.
CELL_BYTES = {"q8_0": 34 / 32, "f16": 2.0}


def _kv_mib(model: LlamaCppModel, cells: int, kind: str = "q8_0") -> float:
    """The size of llama.cpp's KV cache of cell type `kind` for `cells` cells of this model."""
    llama, handle = binding(), model.handle
    layers, heads_kv = llama.llama_model_n_layer(handle), llama.llama_model_n_head_kv(handle)
    head_dim = llama.llama_model_n_embd(handle) // llama.llama_model_n_head(handle)
    return float(layers * 2 * heads_kv * head_dim * cells * CELL_BYTES[kind] / 2**20)


#: MiB an engine of up to 64 rows may take beyond its KV cache: compute and logits buffers (a row's
#: logits take 192 KiB), the engine thread's malloc arena.
BUFFERS_MIB = 96


def test_the_kv_cache_is_sized_to_the_tokens_a_batch_holds_and_traffic_adds_no_memory(
    llamacpp_model: LlamaCppModel, llamacpp_engine: EngineFactory
) -> None:
    """What bounds a worker's memory (bench/worker_memory.py measures a whole worker): llama.cpp
    allocates and zeroes its whole KV cache at start, so the default cache holds the tokens a batch
    may hold (max_batch_tokens + llamacpp_cache_tokens cells, workers/engine/llamacpp/context.py),
    not a stream of llamacpp_sequence_tokens cells per row: 64 rows take what 16 do. Jobs, long prompts among
    them, then add no more than buffers, and the cells the rows keep are the tokens the jobs wrote,
    within the cache's bound. The weights are never dequantized (fp32 would add ~520 MiB)."""
    config = EngineConfig()
    shared_mib = _kv_mib(llamacpp_model, config.max_batch_tokens + config.llamacpp_cache_tokens)
    streams_mib = _kv_mib(llamacpp_model, 16 * config.llamacpp_sequence_tokens)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _rss_mib()
    engine = llamacpp_engine(max_batch_size=16)
    started, start_peak = _rss_mib() - before, _status_mib("VmHWM") - before
    long_prompt = " ".join(["alpha beta gamma delta"] * 150)  # ~600 tokens: a full physical batch
    jobs = [_chat(f"m{i}", PROMPTS[i % 4], max_tokens=8) for i in range(14)]
    jobs += [_chat(f"long{i}", f"{i}: {long_prompt}", max_tokens=4) for i in range(2)]
    results = [future.result(120) for future in [engine.submit(job) for job in jobs]]
    executor = _executor(engine)
    _wait_for(lambda: executor.rows == 0)
    grown, peak = _rss_mib() - before, _status_mib("VmHWM") - before
    print(f"a 16-row llama.cpp engine: +{started:.0f} MiB started, +{grown:.0f} after jobs, peak "
          f"+{peak:.0f} (shared cache {shared_mib:.0f} MiB, a stream per row {streams_mib:.0f})")  # fmt: skip
    assert start_peak < shared_mib + BUFFERS_MIB < streams_mib
    assert peak < shared_mib + BUFFERS_MIB
    kept = [executor.cells(row) for row in range(16)]
    assert sum(kept) <= config.llamacpp_cache_tokens
    written = [result.prompt_tokens + result.completion_tokens - 1 for result in results]
    assert all(cells in written for cells in kept if cells)  # a job's prompt and all but its last token
    before_wide = _rss_mib()
    llamacpp_engine(max_batch_size=64)
    assert _rss_mib() - before_wide < shared_mib + BUFFERS_MIB  # rows add seq_ids, not cells


def test_the_default_threads_are_the_physical_cores() -> None:
    """One llama.cpp thread per physical core this process may use (SMT siblings count once)."""
    assert 1 <= physical_cores() <= len(os.sched_getaffinity(0))
    executor = LlamaCppExecutor(EngineConfig(model=DEFAULT_MODEL))
    assert executor.threads == physical_cores()
