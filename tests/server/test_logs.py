"""Rate-limited logging (hopserve.logs) with real loggers and handlers, and its installation
by the CLI's logging setup and by the servers' per-request loggers."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from hopserve.logs import REPEATS, RepeatFilter, install, rate_limited


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def logged(request: pytest.FixtureRequest) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A private logger writing ``LEVEL message`` lines to a string buffer (its handler
    is ``logger.handlers[0]``; pytest may add its own capture handlers after it)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger(f"hopserve.test.{request.node.name}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    yield logger, stream
    logger.removeHandler(handler)
    logger.filters.clear()


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_identical_warnings_are_one_line_plus_a_count(logged, clock) -> None:
    logger, stream = logged
    install(logger.handlers[:1], RepeatFilter(60, clock=clock))
    for i in range(58):  # one line, 57 repeats within the window
        clock.now = 1000.0 + i
        logger.warning("worker %s unavailable: %s", "w1", "connection refused")
    assert lines(stream) == ["WARNING worker w1 unavailable: connection refused"]
    clock.now = 1060.0  # the window has passed: the next one reports the count
    logger.warning("worker %s unavailable: %s", "w1", "connection refused")
    assert lines(stream)[1:] == [
        "WARNING worker w1 unavailable: connection refused (repeated 57 times in the last 60 s)"
    ]
    clock.now = 1200.0  # nothing was dropped since: a plain line again
    logger.warning("worker %s unavailable: %s", "w1", "connection refused")
    assert lines(stream)[2:] == ["WARNING worker w1 unavailable: connection refused"]


def test_different_messages_levels_and_info_pass(logged, clock) -> None:
    logger, stream = logged
    install(logger.handlers[:1], RepeatFilter(60, clock=clock))
    for _ in range(3):
        logger.warning("a")
        logger.error("a")  # another level: its own key
        logger.warning("b")
        logger.info("same info")  # below WARNING: never dropped
        logger.debug("same debug")
    assert lines(stream) == [
        "WARNING a",
        "ERROR a",
        "WARNING b",
        *["INFO same info", "DEBUG same debug"] * 3,
    ]


def test_logger_and_handler_filter_judge_a_record_once(logged, clock) -> None:
    logger, stream = logged
    flt = RepeatFilter(60, clock=clock)
    rate_limited(logger.name, flt)  # on the logger ...
    install(logger.handlers[:1], flt)  # ... and on its handler: still one verdict per record
    rate_limited(logger.name, flt)  # idempotent
    install(logger.handlers[:1], flt)
    assert logger.filters == [flt] and logger.handlers[0].filters == [flt]
    logger.warning("x")
    logger.warning("x")
    clock.now += 61
    logger.warning("x")
    assert lines(stream) == ["WARNING x", "WARNING x (repeated 1 times in the last 61 s)"]


def test_exceptions_are_rate_limited_with_their_traceback(logged, clock) -> None:
    logger, stream = logged
    install(logger.handlers[:1], RepeatFilter(60, clock=clock))
    for _ in range(20):
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("job failed")
    assert stream.getvalue().count("Traceback") == 1
    assert stream.getvalue().count("ERROR job failed") == 1


def test_memory_is_bounded(clock) -> None:
    flt = RepeatFilter(60, max_keys=10, clock=clock)
    logger = logging.getLogger("hopserve.test.bounded")
    for i in range(100):
        record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, f"m{i}", None, None)
        assert flt.filter(record)
    assert len(flt._seen) == 10


def test_cli_logging_setup_installs_the_filter() -> None:
    from hopserve.cli import setup_logging

    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    for handler in saved:  # as in a fresh `hopserve serve` process
        root.removeHandler(handler)
    try:
        setup_logging(verbose=False)
        (handler,) = root.handlers
        assert REPEATS in handler.filters and root.level == logging.INFO
        root.removeHandler(handler)
        root.addHandler(other := logging.StreamHandler(io.StringIO()))
        setup_logging(verbose=True)  # someone else configured logging: left alone
        assert root.handlers == [other] and not other.filters
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in saved:
            root.addHandler(handler)
        root.setLevel(level)


def test_server_loggers_are_rate_limited() -> None:
    import hopserve.rpc
    import hopserve.server.edge
    import hopserve.server.errors
    import hopserve.worker.service

    modules = (hopserve.server.errors, hopserve.server.edge, hopserve.worker.service)
    for module in (*modules, hopserve.rpc):
        logger = logging.getLogger(module.__name__)
        assert REPEATS in logger.filters, module.__name__
