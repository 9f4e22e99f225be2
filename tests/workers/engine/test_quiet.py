"""workers/engine/quiet.py: the start-up warnings nobody can act on are dropped, anything else the
same loggers say still shows, and installing twice adds no second filter. (A real worker's start
is checked in tests/workers/test_worker_output.py.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from workers.engine import quiet


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def collected() -> Iterator[_Collect]:
    handler = _Collect()
    loggers = [logging.getLogger(name) for name, _ in quiet.UNACTIONABLE]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


def test_unactionable_records_are_dropped_and_others_kept(collected: _Collect) -> None:
    quiet.install()  # what importing workers.engine did already
    logging.getLogger("torchao").warning("Failed to load /site-packages/torchao/_C_mxfp8.so: undefined")
    logging.getLogger("torchao.kernel.intmm").warning("Warning: Detected no triton, on systems without")
    logging.getLogger("torch.utils._pytree").warning(
        "%s is an Enum subclass and is now natively supported", "torchao.Kind"
    )
    logging.getLogger("torchao").warning("a quantizer refused this layer")
    assert collected.messages == ["a quantizer refused this layer"]


def test_install_is_idempotent() -> None:
    quiet.install()
    quiet.install()
    for name, _ in quiet.UNACTIONABLE:
        filters = logging.getLogger(name).filters
        assert sum(type(f).__name__ == "_Drop" for f in filters) == 1
