"""The two completion flavours OpenAI's API has, chat and text: the names of their objects and ids."""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    """The two completion flavours: OpenAI's object names and id prefixes, and the `source` a
    job's metadata records."""

    CHAT = ("chat.completion", "chat.completion.chunk", "chatcmpl-", "openai.chat.completions")
    TEXT = ("text_completion", "text_completion", "cmpl-", "openai.completions")

    def __init__(self, obj: str, chunk_obj: str, id_prefix: str, source: str) -> None:
        self.obj = obj
        self.chunk_obj = chunk_obj
        self.id_prefix = id_prefix
        self.source = source
