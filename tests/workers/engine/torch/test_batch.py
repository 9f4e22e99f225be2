"""workers/engine/torch/batch.py: RunningBatch is the one owner of which member holds which row (a
member leaving from the middle hands its row to the last one), refuses a member twice, warms up
at its largest shape and empties again, and scores every prompt position on request (random-tiny).
Its logits against an uncached forward pass: tests/workers/engine/torch/test_kv_cache.py."""

from __future__ import annotations

import pytest
import torch

from workers.engine.torch.batch import RunningBatch
from workers.engine.torch.loading import LoadedModel

PROMPT = [101, 2000, 345, 678, 9012, 77]


@pytest.fixture
def batch(random_model: LoadedModel) -> RunningBatch[str]:
    return RunningBatch(random_model.model, max_rows=4)


def test_members_keep_their_rows_as_others_leave(batch: RunningBatch[str]) -> None:
    with torch.inference_mode():
        for name in "abcd":
            cache, _ = batch.prefill(PROMPT)
            batch.join(name, cache)
        assert batch.members == ["a", "b", "c", "d"] and batch.rows == 4
        batch.leave("b")  # "d" moves into row 1
        assert batch.members == ["a", "d", "c"] and batch.row("d") == 1 and batch.row("c") == 2
        batch.leave("c")  # the last row: nothing moves
        assert batch.members == ["a", "d"] and batch.rows == 2
        logits = batch.decode([5, 5])
    assert logits.shape[0] == 2
    # Same prompt, same next token: both rows' logits agree whichever row they moved to.
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)


def test_a_member_joins_once(batch: RunningBatch[str]) -> None:
    with torch.inference_mode():
        cache, _ = batch.prefill(PROMPT)
        assert batch.join("a", cache) == 0
        with pytest.raises(ValueError, match="already holds row 0"):
            batch.join("a", batch.prefill(PROMPT)[0])


def test_warm_up_fills_every_row_then_empties(batch: RunningBatch[str]) -> None:
    with torch.inference_mode():
        assert batch.warm_up(PROMPT, steps=2)
        assert batch.rows == 0 and batch.members == []
        batch.join("a", batch.prefill(PROMPT)[0])
        with pytest.raises(RuntimeError, match="members"):
            batch.warm_up(PROMPT, steps=1)


def test_prefill_scores_every_position_on_request(
    batch: RunningBatch[str], random_model: LoadedModel
) -> None:
    with torch.inference_mode():
        _, last = batch.prefill(PROMPT)
        _, every = batch.prefill(PROMPT, every_position=True)
        reference = random_model.model(input_ids=torch.tensor([PROMPT]), use_cache=False).logits[0]
    assert last.shape[0] == 1 and every.shape[0] == len(PROMPT)
    torch.testing.assert_close(every, reference, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(last[0], reference[-1], atol=1e-4, rtol=1e-4)


def test_a_prompt_no_longer_than_the_shared_prefix_is_prefilled_whole(
    batch: RunningBatch[str], random_model: LoadedModel
) -> None:
    """At least one token must remain past the prefix: its logits are the prefill's output."""
    with torch.inference_mode():
        batch.share_prefix(PROMPT)
        cache, logits = batch.prefill(PROMPT)
        reference = random_model.model(input_ids=torch.tensor([PROMPT]), use_cache=False).logits[0, -1]
    torch.testing.assert_close(logits[0], reference, atol=1e-4, rtol=1e-4)
    assert cache.get_seq_length() == len(PROMPT)
