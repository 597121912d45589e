"""Capturing log records in tests: real logging, a handler on the root logger."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class Records(logging.Handler):
    """Every record logged while installed (real logging, root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self) -> list[str]:
        """ERROR records and records with a traceback, formatted."""
        bad = [r for r in self.records if r.levelno >= logging.ERROR or r.exc_info]
        return [f"{r.name} {r.levelname}: {r.getMessage()[:300]}" for r in bad]


@contextmanager
def capture_records(handler: Records | None = None) -> Iterator[Records]:
    """Install ``handler`` (a new :class:`Records` by default) on the root logger for the
    block; yields it."""
    handler = Records() if handler is None else handler
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
