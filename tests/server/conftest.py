"""Shared fixtures for front-end tests: a real, throw-away ``redis-server``.

- ``redis_server`` (function scope): URL of a clean database on the session's private
  redis-server (flushed before each test).
- ``redis_proc`` (session scope): the :class:`RedisServer` behind it.
- ``redis_outage`` (function scope): a private :class:`RedisServer` that a test may
  ``stop()``, ``start()`` (same port), ``pause()`` or ``resume()``.
- ``redis_factory`` (function scope): starts more private servers, e.g. with a password.
- ``unused_redis_url``: a URL where nothing listens.
- ``redis_cluster`` (function scope): the module's :class:`LocalRedisCluster` (3 masters,
  1 replica each; ``redis_cluster_proc``), flushed before each test; never kill its nodes.
- ``redis_cluster_factory`` (function scope): ``redis_cluster_factory(replicas=1)``
  starts a private cluster this test may kill masters of.

Servers listen on 127.0.0.1 on a free port with persistence off; the machine's own Redis
(6379) is never touched. Tests that need Redis are skipped only if ``redis-server`` (and,
for a cluster, ``redis-cli``) is not installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hopserve.testing import LocalRedisCluster, RedisServer, free_port

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def start_redis(workdir: Path, password: str | None = None) -> RedisServer:
    """Start a private redis-server on a free port (skips the test if not installed)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    try:
        return RedisServer.launch(workdir, password=password)
    except RuntimeError as err:
        pytest.fail(str(err))


@pytest.fixture(scope="session")
def redis_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One private redis-server for the whole session."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_server(redis_proc: RedisServer) -> str:
    """URL of the session's redis-server, flushed and with stats reset."""
    if redis_proc.proc is None:
        redis_proc.start()
    with redis_proc.client() as client:
        client.flushall()
        client.config_resetstat()
    return redis_proc.url


@pytest.fixture
def redis_outage(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server this test may kill, restart, pause and resume."""
    server = start_redis(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """``redis_factory(password=None)`` starts another private server; all stop at teardown."""
    servers: list[RedisServer] = []

    def start(password: str | None = None) -> RedisServer:
        server = start_redis(tmp_path / f"redis{len(servers)}", password=password)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def unused_redis_url() -> str:
    """A Redis URL on 127.0.0.1 where nothing listens (connections are refused)."""
    return f"redis://127.0.0.1:{free_port()}/0"


def start_redis_cluster(workdir: Path, **kwargs: object) -> LocalRedisCluster:
    """Start a private Redis Cluster (skips the test if redis-server or redis-cli is not
    installed); ``kwargs`` go to :class:`LocalRedisCluster`."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("redis-server and redis-cli are not installed (apt-get install redis)")
    try:
        return LocalRedisCluster(workdir, **kwargs).start()  # type: ignore[arg-type]
    except RuntimeError as err:
        pytest.fail(str(err))


@pytest.fixture(scope="module")
def redis_cluster_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """One private Redis Cluster (3 masters, 1 replica each) for the module."""
    cluster = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster(redis_cluster_proc: LocalRedisCluster) -> LocalRedisCluster:
    """The module's Redis Cluster, flushed and with command stats reset."""
    redis_cluster_proc.flushall()
    return redis_cluster_proc


@pytest.fixture
def redis_cluster_factory(tmp_path: Path) -> Iterator[Callable[..., LocalRedisCluster]]:
    """``redis_cluster_factory(**kwargs)`` starts a private cluster (see
    :class:`LocalRedisCluster`) the test may kill nodes of; all stop at teardown."""
    clusters: list[LocalRedisCluster] = []

    def start(**kwargs: object) -> LocalRedisCluster:
        clusters.append(start_redis_cluster(tmp_path / f"cluster{len(clusters)}", **kwargs))
        return clusters[-1]

    yield start
    for cluster in clusters:
        cluster.stop()
