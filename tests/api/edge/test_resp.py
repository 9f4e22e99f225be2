"""RESP helpers shared by the AutoPipeline and the subscription (api/edge/resp.py): commands pack
to the bytes redis-py's own packer writes, and what it refuses is refused; replies come out of a
reader whole, in order, an error reply as an object among them. The take-over itself is tested
through its users (tests/api/edge/test_autopipeline.py, test_subscription.py)."""

from __future__ import annotations

import hiredis
import pytest
import redis.asyncio as aioredis
import redis.exceptions
from hypothesis import given
from hypothesis import strategies as st

from api.edge.resp import pack_command, replies

ARG = st.one_of(
    st.text(max_size=50),
    st.binary(max_size=50),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
)


COMMAND = st.lists(ARG, min_size=1, max_size=8).map(lambda args: ["CMD", *args])


@given(st.lists(COMMAND, min_size=1, max_size=4))
def test_packing_matches_redis_py(commands: list[list[object]]) -> None:
    connection = aioredis.Redis().connection_pool.make_connection()  # type: ignore[no-untyped-call]  # unannotated in redis-py
    assert b"".join(map(pack_command, commands)) == b"".join(connection.pack_commands(commands))


def test_packing_refuses_what_redis_py_refuses() -> None:
    for bad in (True, None, object()):
        with pytest.raises(redis.exceptions.DataError):
            pack_command(["SET", "k", bad])


def test_replies_come_whole_and_in_order_across_reads() -> None:
    reader = hiredis.Reader(replyError=redis.exceptions.ResponseError)
    assert list(replies(reader, b"+OK\r\n:4")) == [b"OK"]  # the integer is not whole yet
    got = list(replies(reader, b"2\r\n-ERR nope\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n"))
    assert got[0] == 42 and isinstance(got[1], redis.exceptions.ResponseError) and got[2] == [b"a", b"b"]
