"""Commands packed by hiredis's C packer on the API's connections.

Why: redis-py's asyncio `Connection.pack_command` packs in Python, re-joining its growing buffer
for every argument: the job submit script's few dozen arguments cost more CPU there than the rest
of the request's Redis I/O. redis-py's sync connections already pack with hiredis when it is
installed (its `HiredisRespSerializer`); the asyncio ones never do.

How: through redis-py's public extension point, a pool's `connection_class`: the class its
scheme chose (TCP, TLS or a Unix socket), with `pack_command` overridden by one that gives the
same bytes and refuses the same arguments (DataError for a bool or None, UnicodeEncodeError for
a str that is no UTF-8), for the UTF-8 encoding the API's clients use."""

from __future__ import annotations

from typing import Any, cast

import hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import DataError


def pack_command(*args: Any) -> list[bytes]:
    """One command in RESP, as redis-py packs it: a command name with spaces ("SCRIPT LOAD") is
    sent as several arguments; str as UTF-8, int and float as their repr, bytes-likes as bytes."""
    name = args[0].encode() if isinstance(args[0], str) else args[0]
    if b" " in name:
        args = (*name.split(), *args[1:])
    try:
        return [hiredis.pack_command(args)]
    except TypeError:  # a bytearray, which hiredis takes only as bytes; or what redis-py refuses
        args = tuple(bytes(arg) if isinstance(arg, bytearray | memoryview) else arg for arg in args)
    try:
        return [hiredis.pack_command(args)]
    except TypeError as exc:
        raise DataError(f"Invalid input: {exc} Convert to a bytes, string, int or float first.") from exc


class HiredisPacking:
    """Mixed in before a redis-py asyncio connection class: its commands packed by hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return pack_command(*args)


_PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def with_hiredis_packing(base: type[AbstractConnection]) -> type[AbstractConnection]:
    """`base` (the connection class a pool chose for its URL), packing with hiredis."""
    if base not in _PACKING:
        made = type(f"HiredisPacking{base.__name__}", (HiredisPacking, base), {})
        _PACKING[base] = cast(type[AbstractConnection], made)
    return _PACKING[base]
