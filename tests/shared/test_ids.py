"""Job ids and message tags are random version-4 UUIDs in canonical form, like uuid.uuid4()'s."""

from __future__ import annotations

import uuid

from shared.ids import new_id


def test_ids_are_canonical_random_uuids() -> None:
    ids = [new_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text  # lower-case hex, 8-4-4-4-12
    # Every bit outside the version and variant bits varies across ids.
    every = (1 << 128) - 1
    fixed = (0xF << 76) | (0b11 << 62)  # the version nibble and the variant bits
    seen_ones = seen_zeros = 0
    for text in ids:
        value = uuid.UUID(text).int
        seen_ones |= value
        seen_zeros |= every ^ value
    assert (seen_ones & seen_zeros) | fixed == every
