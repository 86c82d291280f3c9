"""Silence the one start-up warning that is neither ours nor the user's to act on.

Transformers imports torchao whenever it is installed (our `quantised` extra), at its
first model load; torchao then registers Enum classes with torch's pytree, which torch
2.14 logs as deprecated ("... is an Enum subclass and is now natively supported by
torch.compile ..."), twice, on every command and notebook. Only that message of that
logger is dropped: every other torch warning still shows.
"""

from __future__ import annotations

import logging

__all__ = ["install"]

_ENUM_NOTE = "is an Enum subclass and is now natively supported by torch.compile"


class _DropEnumRegistrationNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _ENUM_NOTE not in record.getMessage()


def install() -> None:
    """Add the filter to torch's pytree logger (once, however often explain is imported)."""
    logger = logging.getLogger("torch.utils._pytree")
    if not any(isinstance(f, _DropEnumRegistrationNote) for f in logger.filters):
        logger.addFilter(_DropEnumRegistrationNote())
