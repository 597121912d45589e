"""Counting what redis-py sends: the commands in each pipeline, in order."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio.client


def count_pipeline_executions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the number of commands in each pipeline redis-py executes, in order."""
    calls: list[int] = []
    original = redis.asyncio.client.Pipeline.execute

    async def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(self.command_stack))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", execute)
    return calls
