"""Helpers for hopserve's own tests, benchmarks and local stacks (not imported by the service).

Like ``numpy.testing``: real components, started and stopped for a test or a benchmark.
:func:`free_port` picks a loopback port; :class:`RedisServer` runs a throw-away
``redis-server`` that can be killed, restarted on the same port, paused and resumed;
:class:`LocalRedisCluster` runs a throw-away Redis Cluster whose masters can be killed.
"""

from hopserve.testing.processes import RedisServer, free_port, wait_for_port
from hopserve.testing.redis_cluster import LocalRedisCluster

__all__ = ["LocalRedisCluster", "RedisServer", "free_port", "wait_for_port"]
