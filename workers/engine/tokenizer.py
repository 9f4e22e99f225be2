"""FolderTokenizer: what the engine needs of a saved Hugging Face tokenizer (tokenizer.json beside
tokenizer_config.json and the chat template), on the `tokenizers` library and jinja2 alone.

The llama.cpp worker tokenizes with it instead of transformers' AutoTokenizer: importing any of
transformers' tokenizer classes imports torch whenever torch is installed
(transformers.utils.generic), ~200 MB of a worker's memory for a tokenizer whose work is done by
the same `tokenizers` library underneath.

Equal to transformers' tokenizer on the same folder (tests/workers/engine/test_tokenizer.py
compares them): encode is the backend's encode, decode the backend's decode (with
clean_up_tokenization_spaces when the folder asks for it, which transformers skips for BPE
models unless told otherwise), and the chat template renders as
apply_chat_template does for what genq passes it (messages, add_generation_prompt, the special
tokens): jinja2's immutable sandbox, trim_blocks and lstrip_blocks, loop controls, the tojson filter
without HTML escaping, raise_exception and strftime_now, {% generation %} blocks rendering their
body; the rendering is then encoded without special tokens added.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from copy import copy
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import tokenizers

#: The special tokens a chat template may name (transformers passes them all as variables).
_SPECIAL_TOKENS = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip
#: transformers' clean_up_tokenization: spaces before punctuation and English contractions.
_CLEAN_UPS = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
    (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Encoded:
    """What calling a tokenizer returns, as far as the engine reads it."""

    input_ids: list[int]


class FolderTokenizer:
    """A tokenizer saved by transformers' save_pretrained (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self._backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_file = folder / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.is_file() else {}
        _require_added_tokens(self._backend, config, folder)
        template_file = folder / "chat_template.jinja"
        template = template_file.read_text() if template_file.is_file() else config.get("chat_template")
        self.chat_template: str | None = _default_template(template)
        self.special_tokens_map = {
            name: _content(config[name]) for name in _SPECIAL_TOKENS if config.get(name) is not None
        }
        eos = self.special_tokens_map.get("eos_token")
        self.eos_token_id: int | None = self._backend.token_to_id(eos) if eos is not None else None
        # transformers skips this clean-up for BPE models (it would strip real spaces) unless forced.
        forced = config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
        bpe = type(self._backend.model).__name__ == "BPE"
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False)) and (not bpe or bool(forced))

    @property
    def backend_tokenizer(self) -> tokenizers.Tokenizer:
        """The `tokenizers` tokenizer (transformers' fast tokenizers name theirs the same)."""
        return self._backend

    def __call__(self, text: str) -> Encoded:
        return Encoded(self.encode(text))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text: str = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self._clean_up:
            for before, after in _CLEAN_UPS:
                text = text.replace(before, after)
        return text

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = False, tokenize: bool = True
    ) -> list[int] | str:
        """The template's rendering of `messages`: its token ids, or its text with tokenize=False."""
        rendered = self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens_map
        )
        return self.encode(rendered, add_special_tokens=False) if tokenize else rendered

    @cached_property
    def _template(self) -> jinja2.Template:
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
        return environment.from_string(self.chat_template)


def tokenizer_json(tokenizer: Any) -> str:
    """The `tokenizers` JSON of a FolderTokenizer or a transformers fast tokenizer, without padding
    or truncation (what llguidance builds its token view from)."""
    backend = copy(tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    return str(backend.to_str())


def _require_added_tokens(backend: tokenizers.Tokenizer, config: dict[str, Any], folder: Path) -> None:
    """transformers also reads added tokens from tokenizer_config.json; save_pretrained writes them
    into tokenizer.json as well. A folder where they differ is refused, never tokenized differently."""
    for token_id, entry in config.get("added_tokens_decoder", {}).items():
        if backend.id_to_token(int(token_id)) != entry["content"]:
            message = f"{folder}: added token {token_id} ({entry['content']!r}) is not in tokenizer.json"
            raise ValueError(message)


def _default_template(template: Any) -> str | None:
    """A template string, or the one named "default" of a list of named templates (older configs)."""
    if isinstance(template, list):
        named = {entry["name"]: entry["template"] for entry in template}
        return named.get("default")
    return template if isinstance(template, str) else None


def _content(token: Any) -> str:
    """A special token as configured: a string, or an AddedToken's serialized dict."""
    return str(token["content"]) if isinstance(token, dict) else str(token)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own tojson escapes HTML characters, which a prompt must not see.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


class _Generation(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} (marks assistant tokens for training masks): its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a plain attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return str(caller())
