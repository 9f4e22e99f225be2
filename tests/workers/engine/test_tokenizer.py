"""workers/engine/tokenizer.py's FolderTokenizer against transformers' tokenizer on the same folder
(the default GGUF's): the same ids for raw text and for chat messages, the same text back, the same
llguidance view; and the template features transformers gives a chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jinja2
import pytest
from transformers import AutoTokenizer

from tests.workers.engine.conftest import MODEL_CACHE
from workers.engine.gguf import default_gguf_path, tokenizer_folder
from workers.engine.prompts import tokenize
from workers.engine.tokenizer import FolderTokenizer, tokenizer_json

pytestmark = pytest.mark.slow

TEXTS = [
    "The capital of France is",
    "  leading spaces, trailing ones  ",
    "naïve café, 東京, emoji 🙂🚀 and\ttabs\nnewlines",
    "<|im_start|>user\nspecial tokens inside text<|im_end|>",
    "def add(a, b):\n    return a + b\n",
    "",
]
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, in 日本語?"},
    ],
]


@pytest.fixture(scope="module")
def folder() -> Path:
    return tokenizer_folder(default_gguf_path(), MODEL_CACHE)


@pytest.fixture(scope="module")
def ours(folder: Path) -> FolderTokenizer:
    return FolderTokenizer(folder)


@pytest.fixture(scope="module")
def theirs(folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("text", TEXTS)
def test_raw_text_encodes_and_decodes_as_transformers(ours: FolderTokenizer, theirs: Any, text: str) -> None:
    ids = ours(text).input_ids
    assert ids == list(theirs(text).input_ids)
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_messages_render_as_transformers(
    ours: FolderTokenizer, theirs: Any, messages: list[dict[str, str]]
) -> None:
    assert tokenize(ours, "", messages) == tokenize(theirs, "", messages)
    for generation_prompt in (False, True):
        text = ours.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        assert text == theirs.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        )


def test_the_special_tokens_and_the_llguidance_view_are_transformers(
    ours: FolderTokenizer, theirs: Any
) -> None:
    assert ours.eos_token_id == theirs.eos_token_id == 2
    assert ours.chat_template == theirs.chat_template
    assert tokenizer_json(ours) == tokenizer_json(theirs)


def _folder_with(tmp_path: Path, folder: Path, template: str, **config: Any) -> Path:
    copy = tmp_path / "tokenizer"
    shutil.copytree(folder, copy)
    (copy / "chat_template.jinja").write_text(template)
    settings = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**settings, **config}))
    return copy


def test_templates_get_transformers_helpers(tmp_path: Path, folder: Path) -> None:
    """tojson without HTML escaping, the special tokens as variables, {% generation %} and loop
    controls render; raise_exception fails the rendering."""
    template = (
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}{{ eos_token }}"
    )
    copy = _folder_with(tmp_path, folder, template)
    messages = [{"role": "user", "content": content} for content in ("<b>&</b>", "2", "3")]
    rendered = FolderTokenizer(copy).apply_chat_template(messages, tokenize=False)
    assert rendered == AutoTokenizer.from_pretrained(copy).apply_chat_template(messages, tokenize=False)
    assert '"<b>&</b>"' in str(rendered) and '"3"' not in str(rendered)
    failing = FolderTokenizer(_folder_with(tmp_path / "b", folder, "{{ raise_exception('no system role') }}"))
    with pytest.raises(jinja2.TemplateError, match="no system role"):
        failing.apply_chat_template(messages)


def test_a_template_cannot_reach_python_internals(tmp_path: Path, folder: Path) -> None:
    """Templates from a model file are untrusted: the sandbox refuses attribute escapes."""
    escape = _folder_with(tmp_path, folder, "{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        FolderTokenizer(escape).apply_chat_template([{"role": "user", "content": "x"}])


def test_clean_up_tokenization_spaces_follows_transformers(tmp_path: Path, folder: Path) -> None:
    """Asked for, it is skipped on a BPE model (as transformers does: it would strip real spaces),
    unless forced."""
    text = "It is n't here , is it ?"
    asked = _folder_with(tmp_path / "asked", folder, "", clean_up_tokenization_spaces=True)
    forced = _folder_with(
        tmp_path / "forced", folder, "", clean_up_tokenization_spaces=True,
        clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output=True,
    )  # fmt: skip
    for copy, expected in ((asked, text), (forced, "It isn't here, is it?")):
        ours, theirs = FolderTokenizer(copy), AutoTokenizer.from_pretrained(copy)
        ids = ours(text).input_ids
        assert ours.decode(ids) == theirs.decode(ids) == expected


def test_a_folder_whose_added_tokens_differ_is_refused(tmp_path: Path, folder: Path) -> None:
    copy = _folder_with(
        tmp_path, folder, "", added_tokens_decoder={"2": {"content": "<|not-eos|>", "special": True}}
    )
    with pytest.raises(ValueError, match="added token 2"):
        FolderTokenizer(copy)
