"""make_cache: backend selection, auto fallback to memory, passwords kept out of logs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest

from hopserve.config import CacheConfig
from hopserve.server.cache import (
    CacheNamespace,
    EmbeddingCache,
    MemoryEmbeddingCache,
    NullCache,
    RedisEmbeddingCache,
    make_cache,
)

NS = CacheNamespace("m", "1", "g", dim=4)
LOGGERS = "hopserve.server.cache"


def build(**fields: Any) -> EmbeddingCache:
    async def scenario() -> EmbeddingCache:
        cache = await make_cache(CacheConfig(**fields))
        await cache.close()
        return cache

    return asyncio.run(scenario())


def test_auto_uses_redis_when_it_answers(redis_server: str) -> None:
    async def scenario() -> None:
        cache = await make_cache(CacheConfig(backend="auto", redis_url=redis_server, ttl_s=60))
        assert isinstance(cache, RedisEmbeddingCache) and cache.ttl_s == 60
        await cache.put_many(NS, np.array([1]), np.ones((1, 4)))
        assert (await cache.get_many(NS, np.array([1])))[0].all()
        await cache.close()

    asyncio.run(scenario())


def test_auto_falls_back_to_memory(unused_redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGERS):
        cache = build(backend="auto", redis_url=unused_redis_url, memory_max_entries=77)
    assert isinstance(cache, MemoryEmbeddingCache) and cache.max_entries == 77
    lines = [r for r in caplog.records if r.levelno == logging.INFO]
    assert any(
        "in-process memory LRU of 77 rows" in r.getMessage() and "Redis at" in r.getMessage()
        for r in lines
    ), caplog.text
    assert "Connect" in caplog.text or "refused" in caplog.text  # says why
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_auto_fallback_log_redacts_password(
    redis_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_factory(password="right-pw")
    wrong = server.url.replace("right-pw", "wrong-pw")
    with caplog.at_level(logging.INFO, logger=LOGGERS):
        cache = build(backend="auto", redis_url=wrong)
    assert isinstance(cache, MemoryEmbeddingCache)
    assert "wrong-pw" not in caplog.text and ":***@" in caplog.text
    assert isinstance(build(backend="auto", redis_url=server.url), RedisEmbeddingCache)


def test_explicit_redis_is_kept_when_down(
    unused_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGERS):
        cache = build(backend="redis", redis_url=unused_redis_url)
    assert isinstance(cache, RedisEmbeddingCache) and not cache.available
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no answer at start-up" in warnings[0].getMessage()


def test_memory_and_none(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGERS):
        memory = build(backend="memory", memory_max_entries=5, ttl_s=0)
        none = build(backend="none")
    assert isinstance(memory, MemoryEmbeddingCache) and memory.ttl_s is None
    assert isinstance(none, NullCache)
    assert "cache.backend=memory" in caplog.text and "disabled" in caplog.text


def test_integrity_key_file_keys_the_mac(redis_server: str, tmp_path) -> None:
    key_file = tmp_path / "cache.key"
    key_file.write_text("0123456789abcdef0123456789abcdef\n")

    async def scenario() -> None:
        keyed = await make_cache(
            CacheConfig(backend="redis", redis_url=redis_server, integrity_key_file=key_file)
        )
        unkeyed = await make_cache(CacheConfig(backend="redis", redis_url=redis_server))
        await keyed.put_many(NS, np.array([1]), np.ones((1, 4)))
        assert (await keyed.get_many(NS, np.array([1])))[0].all()
        assert not (await unkeyed.get_many(NS, np.array([1])))[0].any()  # cannot forge
        assert unkeyed.stats.rejected == 1
        await keyed.close()
        await unkeyed.close()

    asyncio.run(scenario())


def test_short_or_missing_integrity_key_is_a_config_error(tmp_path, caplog) -> None:
    from hopserve.config import ConfigError

    short = tmp_path / "short.key"
    short.write_text("tiny-secret")
    with pytest.raises(ConfigError, match="holds 11 bytes") as info:
        build(backend="redis", integrity_key_file=short)
    assert "tiny-secret" not in str(info.value)
    with pytest.raises(ConfigError, match="cannot read"):
        build(backend="redis", integrity_key_file=tmp_path / "absent.key")
