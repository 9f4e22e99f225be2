"""workers/engine/torch/executor.py: the transformers executor on the real default model. Its
KV cache, prefix sharing and row map are not fooling themselves: solo greedy output is
transformers' own generate(). (What both backends share is tests/workers/engine/test_default_model.py.)"""

from __future__ import annotations

from typing import Any, Protocol, cast

import pytest
import torch
from transformers import BatchEncoding

from tests.workers.engine.conftest import EngineFactory
from tests.workers.engine.test_default_model import PROMPTS, _chat
from workers.engine.torch.loading import LoadedModel

pytestmark = pytest.mark.slow


class CausalLM(Protocol):
    """The model as generate() sees it: LoadedModel declares a PreTrainedModel, and its causal-LM
    classes add generate() through GenerationMixin (greedy, no dict asked for: token ids)."""

    def generate(self, inputs: torch.Tensor, **kwargs: Any) -> torch.Tensor: ...


def test_solo_greedy_is_what_transformers_generates(
    default_engine: EngineFactory, default_model: LoadedModel
) -> None:
    """The engine's cache is not fooling itself: solo output is transformers' own generate()."""
    engine = default_engine(max_batch_size=2)
    tokenizer = default_model.tokenizer
    for prompt in PROMPTS[:2]:
        result = engine.submit(_chat("solo", prompt)).result(60)
        ids = cast(  # a BatchEncoding: return_dict defaults to True
            BatchEncoding,
            tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True),
        )
        with torch.inference_mode():
            output = cast(CausalLM, default_model.model).generate(
                torch.tensor([ids["input_ids"]]), max_new_tokens=24, do_sample=False
            )
        expected = tokenizer.decode(output[0, len(ids["input_ids"]) :], skip_special_tokens=True)
        assert result.text == expected
