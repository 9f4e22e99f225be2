"""The batched KV cache against the model run without a cache: same logits for every row, every step.

Sequences join with prompts longer than the free room (the window must move right), decode past the
buffer's edge (it must move left / grow) and leave from the middle (the last row moves), so every
path of SlotKVCache is exercised against a plain full-sequence forward pass.
"""

from __future__ import annotations

import torch

from workers.engine.torch.batch import RunningBatch
from workers.engine.torch.kv_cache import layer_kv
from workers.engine.torch.loading import LoadedModel


def _reference_logits(loaded: LoadedModel, tokens: list[int]) -> torch.Tensor:
    output = loaded.model(input_ids=torch.tensor([tokens]), use_cache=False)
    logits: torch.Tensor = output.logits[0, -1]
    return logits


def test_batched_decode_matches_uncached_forward(random_model: LoadedModel) -> None:
    generator = torch.Generator().manual_seed(0)

    def tokens(count: int) -> list[int]:
        return torch.randint(10, 40000, (count,), generator=generator).tolist()

    batch: RunningBatch[int] = RunningBatch(random_model.model, max_rows=4)
    plan = {0: tokens(3), 5: tokens(90), 9: tokens(7), 30: tokens(150)}  # step -> prompt joining then
    sequences: dict[int, list[int]] = {}  # member (its joining step) -> its tokens
    with torch.inference_mode():
        for step in range(110):
            if step in plan:
                cache, logits = batch.prefill(plan[step])
                # prefill's logits are [1, vocab]: the next token's
                torch.testing.assert_close(logits[-1], _reference_logits(random_model, plan[step]))
                assert batch.join(step, cache) == len(sequences)
                sequences[step] = list(plan[step])
            if step == 60:  # the second sequence leaves; the last row moves into its place
                batch.leave(5)
                del sequences[5]
                assert batch.members == [0, 30, 9] and batch.row(30) == 1
            members = batch.members
            next_tokens = tokens(len(members))
            logits = batch.decode(next_tokens)
            for row, (member, token) in enumerate(zip(members, next_tokens, strict=True)):
                sequences[member].append(token)
                torch.testing.assert_close(
                    logits[row], _reference_logits(random_model, sequences[member]), atol=1e-4, rtol=1e-4
                )
    assert batch.rows == 3


def test_prefix_reuse_matches_full_prefill(random_model: LoadedModel) -> None:
    prompt = torch.randint(10, 40000, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    plain: RunningBatch[int] = RunningBatch(random_model.model, max_rows=2)
    shared: RunningBatch[int] = RunningBatch(random_model.model, max_rows=2)
    with torch.inference_mode():
        shared.share_prefix(prompt[:12])
        plain_cache, plain_logits = plain.prefill(prompt)
        shared_cache, shared_logits = shared.prefill(prompt)
        other_cache, _ = shared.prefill(prompt[:5] + prompt[13:])  # does not start with the prefix
    torch.testing.assert_close(shared_logits, plain_logits, atol=1e-5, rtol=1e-5)
    for layer in range(len(plain_cache.layers)):
        torch.testing.assert_close(
            layer_kv(shared_cache, layer), layer_kv(plain_cache, layer), atol=1e-5, rtol=1e-5
        )
    assert layer_kv(other_cache, 0)[0].shape[-2] == 22
