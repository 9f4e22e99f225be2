"""A prompt's token ids: raw text tokenized verbatim, or chat messages through the tokenizer's
chat template (with the generation prompt). One function for every backend and the benchmarks,
in a module that imports no model code (the llama.cpp worker never loads transformers' models)."""

from __future__ import annotations

from typing import Any


def tokenize(tokenizer: Any, prompt: str, messages: list[dict[str, str]] | None) -> list[int]:
    """A raw prompt's tokens, or the chat template's rendering of `messages` (with the generation prompt)."""
    if messages is None:
        return list(tokenizer(prompt).input_ids)
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded if isinstance(encoded, list) else encoded["input_ids"])
