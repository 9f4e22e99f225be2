"""Start-up noise a worker's user cannot act on, kept off their terminal.

Importing transformers imports torchao (its quantizers), which logs a warning for each of its
CUDA-only kernel libraries that cannot load on a CPU host ("Failed to load .../_C_mxfp8...so")
and one for Triton's absence (a GPU compiler; genq's CPU path never uses it); torch then logs a
deprecation for each of torchao's enums registered as pytree constants ("... is an Enum subclass
... deprecated"). All are about the installed packages, not the user's set-up, and came on every
worker start. Only those records are dropped: anything else these loggers say still shows.
Installed from workers/engine/__init__.py, which runs before any engine module imports torch.
"""

from __future__ import annotations

import logging

#: (logger, the start of the message it logs) for each record dropped.
UNACTIONABLE = (
    ("torchao", "Failed to load "),
    ("torchao.kernel.intmm", "Warning: Detected no triton"),
    ("torch.utils._pytree", "%s is an Enum subclass and is now natively supported"),
)


class _Drop(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self._prefix)


def install() -> None:
    """Idempotent: one filter per logger, however often the package is imported."""
    for name, prefix in UNACTIONABLE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(prefix))
