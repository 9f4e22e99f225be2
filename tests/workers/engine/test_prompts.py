"""A prompt's token ids (workers/engine/prompts.py), on the default model's real tokenizer: raw text
verbatim, messages through the chat template with the generation prompt."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.workers.engine.conftest import MODEL_CACHE
from workers.engine.gguf import default_gguf_path, tokenizer_folder
from workers.engine.prompts import tokenize

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(tokenizer_folder(default_gguf_path(), MODEL_CACHE))


def test_a_raw_prompt_is_tokenized_verbatim(tokenizer: Any) -> None:
    ids = tokenize(tokenizer, "The capital of France is", None)
    assert ids == list(tokenizer("The capital of France is").input_ids)
    assert tokenizer.decode(ids) == "The capital of France is"


def test_messages_go_through_the_chat_template_with_the_generation_prompt(tokenizer: Any) -> None:
    ids = tokenize(tokenizer, "ignored when messages are given", [{"role": "user", "content": "Hi there"}])
    text = tokenizer.decode(ids)
    assert "<|im_start|>user\nHi there<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")  # the model answers next
    assert "ignored" not in text
