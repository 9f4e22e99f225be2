"""The settings' shared field types (shared/settings/types.py): a list setting is given as one
comma-separated value (GENQ_MODELS=a,b), not as JSON."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.config import Settings
from shared.settings.types import split_commas


@pytest.mark.parametrize(
    ("text", "items"),
    [
        ("a,b", ["a", "b"]),
        (" a , b ", ["a", "b"]),
        ("a,,b,", ["a", "b"]),  # a stray comma is not an empty item
        ("", []),
        (" , ", []),
        ('["a","b"]', ['["a"', '"b"]']),  # JSON is not decoded: one syntax only
    ],
)
def test_split_commas_gives_the_non_empty_items(text: str, items: list[str]) -> None:
    assert split_commas(text) == items


def test_a_value_already_a_list_is_left_as_it_is() -> None:
    """Code passes lists (Settings(models=[...])); they are validated as they are."""
    assert split_commas(["a", " b "]) == ["a", " b "]


def test_a_comma_list_setting_reads_from_the_environment(from_env: Callable[..., Settings]) -> None:
    assert from_env(models="random-tiny, smollm2-135m").models == ["random-tiny", "smollm2-135m"]
