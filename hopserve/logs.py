"""Rate-limited logging: one line per repeated message, plus how often it repeated.

A flood of identical warnings (a hostile client, a dead Redis, a lost worker) would
otherwise bury everything else in the log. :class:`RepeatFilter` lets the first record of
a kind through, drops identical ones (same logger, level and formatted message) for
``window_s`` seconds while counting them, and annotates the next one after the window::

    WARNING hopserve.server.errors: GetEmbeddings 'sage': worker unavailable: ...
    WARNING hopserve.server.errors: GetEmbeddings 'sage': worker unavailable: ... \
(repeated 57 times in the last 60 s)

Records below ``level`` (default WARNING) are never dropped. One shared instance,
:data:`REPEATS`, is installed on the root logger's handlers by the CLI's logging setup
(:func:`install`) and on the per-request loggers of the servers (:func:`rate_limited`);
a record that meets it twice (logger and handler) is judged once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

__all__ = ["REPEATS", "RepeatFilter", "install", "rate_limited"]

_VERDICT = "_hopserve_repeat_verdict"  # record attribute: this filter's earlier verdict


class RepeatFilter(logging.Filter):
    """Drop identical records for ``window_s`` seconds, then report how many were dropped.

    Args:
        window_s: How long identical records are suppressed after one got through.
        level: Records below this level always pass.
        max_keys: Distinct messages remembered (least recently seen are forgotten).
        clock: Monotonic seconds (tests pass a fake clock).
    """

    def __init__(
        self,
        window_s: float = 60.0,
        *,
        level: int = logging.WARNING,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        if window_s <= 0 or max_keys < 1:
            raise ValueError(f"bad window_s {window_s} or max_keys {max_keys}")
        self.window_s = window_s
        self.level = level
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        # (logger, level, message) -> [start of the window, records dropped in it]
        self._seen: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        """True to emit ``record`` (possibly with a ``(repeated N times ...)`` suffix)."""
        if record.levelno < self.level:
            return True
        verdict = getattr(record, _VERDICT, None)
        if verdict is not None:
            return bool(verdict)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let logging report it as usual
            return True
        key = (record.name, record.levelno, message)
        now = self._clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is None:
                self._seen[key] = [now, 0]
                if len(self._seen) > self.max_keys:
                    self._seen.popitem(last=False)
                verdict = True
            elif now - entry[0] < self.window_s:
                entry[1] += 1
                verdict = False
            else:
                dropped, elapsed = int(entry[1]), now - entry[0]
                entry[0], entry[1] = now, 0
                self._seen.move_to_end(key)
                if dropped:
                    record.msg = f"{message} (repeated {dropped} times in the last {elapsed:.0f} s)"
                    record.args = None
                verdict = True
        setattr(record, _VERDICT, verdict)
        return verdict

    def reset(self) -> None:
        """Forget every message seen."""
        with self._lock:
            self._seen.clear()


REPEATS = RepeatFilter()
"""The process's shared filter (60 s window, WARNING and above)."""


def _add(filterer: logging.Filterer, flt: RepeatFilter) -> None:
    if not any(isinstance(f, RepeatFilter) for f in filterer.filters):
        filterer.addFilter(flt)


def rate_limited(name: str, flt: RepeatFilter = REPEATS) -> logging.Logger:
    """``logging.getLogger(name)`` with ``flt`` installed on it (idempotent).

    A logger filter sees only the records created on that very logger, so this covers
    a module's own ``logger`` whatever handlers the application configured.
    """
    logger = logging.getLogger(name)
    _add(logger, flt)
    return logger


def install(
    handlers: Iterable[logging.Handler] | None = None, flt: RepeatFilter = REPEATS
) -> RepeatFilter:
    """Install ``flt`` on ``handlers`` (default: the root logger's), idempotently.

    Returns:
        The filter installed.
    """
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        _add(handler, flt)
    return flt
