"""Helpers for hopserve's own tests, benchmarks and local stacks (not imported by the service).

Like ``numpy.testing``: real components, started and stopped for a test or a benchmark.
:func:`free_port` picks a loopback port; :class:`RedisServer` runs a throw-away
``redis-server`` that can be killed, restarted on the same port, paused and resumed.
"""

from hopserve.testing.processes import RedisServer, free_port, wait_for_port

__all__ = ["RedisServer", "free_port", "wait_for_port"]
