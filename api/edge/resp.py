"""RESP on a redis-py connection read by a Protocol of ours: what the AutoPipeline
(api/edge/autopipeline.py) and the pub/sub subscription (api/edge/subscription.py) share. redis-py
opens and authenticates the connection; `take_over` hands its transport to the caller's Protocol,
with a hiredis reader (the parser redis-py uses) that `replies` drains; `pack_command` writes
commands as redis-py's Encoder would.

Fenced: the take-over uses three private names of redis-py (`_writer` and `_close()` on its
connection, and `BaseParser` from its private `redis._parsers`; redis==8.1.0, pinned). Should an
upgrade break them, the take-over raises and its callers fall back on redis-py's own machinery
(each says how); TakeOverFailed, a redis-py ConnectionError, is what a caller sees meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import hiredis
import redis.exceptions
from redis.exceptions import DataError, InvalidResponse


class TakeOverFailed(redis.exceptions.ConnectionError):
    """A redis-py connection could not be taken over (redis-py changed underneath)."""


_P = TypeVar("_P", bound=asyncio.Protocol)


def take_over(
    connection: Any, protocol: Callable[[asyncio.Transport, hiredis.Reader], _P], decode: bool = True
) -> _P:
    """Read a connected redis-py connection with `protocol` from now on, its replies parsed by the
    hiredis reader handed to it (strings if `decode` and the client decodes, else bytes). redis-py
    keeps its stream writer in `_writer` and closes it with `_close()` (redis==8.1.0, pinned), here
    and wherever a taken-over connection is closed; the third private name is `redis._parsers`
    (the fence: see the module docstring)."""
    from redis._parsers import BaseParser  # here, so that its absence is a failed take-over

    encoder = connection.encoder
    options: dict[str, Any] = {"protocolError": InvalidResponse, "replyError": BaseParser.parse_error}
    if decode and encoder.decode_responses:
        options |= {"encoding": encoder.encoding, "errors": encoder.encoding_errors}
    transport = connection._writer.transport
    taken = protocol(transport, hiredis.Reader(**options))
    transport.set_protocol(taken)
    return taken


def replies(reader: hiredis.Reader, data: bytes) -> Iterator[Any]:
    """Each whole reply in what came so far, `data` last (InvalidResponse for bytes that are no
    RESP; an error reply is a RedisError object among them, not raised)."""
    reader.feed(data)
    while (reply := reader.gets()) is not False:
        yield reply


def pack_command(args: Sequence[Any]) -> bytes:
    """One command in RESP, encoding arguments as redis-py's Encoder does (str as UTF-8, int and
    float as their repr, bytes as they are; a bool is refused).

    hiredis's packer (C, the same bytes for str, bytes, int and float) does it, where redis-py's
    own packer re-joins its growing buffer for every argument. What hiredis refuses (a bool, None,
    a bytearray) goes through a Python loop, which packs or refuses it as redis-py does."""
    try:
        packed: bytes = hiredis.pack_command(tuple(args))
    except TypeError:
        return _pack_each(args)
    return packed


def _pack_each(args: Sequence[Any]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    push = out.append
    for arg in args:
        data = _encode(arg)
        push(b"$%d\r\n" % len(data))
        push(data)
        push(b"\r\n")
    return b"".join(out)


def _encode(arg: Any) -> bytes:
    if type(arg) is bytes:
        return arg
    if type(arg) is str:
        return arg.encode()
    if isinstance(arg, bool):
        raise DataError("Invalid input of type: 'bool'. Convert to a bytes, string, int or float first.")
    if isinstance(arg, (int, float)):
        return repr(arg).encode()
    if isinstance(arg, (bytearray, memoryview)):
        return bytes(arg)
    if isinstance(arg, str):
        return arg.encode()
    raise DataError(
        f"Invalid input of type: {type(arg).__name__!r}. Convert to a bytes, string, int or float first."
    )
