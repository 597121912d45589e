"""Token buckets on a fake clock: burst, refill, per-client rates, retry hints, bounds."""

from __future__ import annotations

import pytest

from hopserve.security import ratelimit
from hopserve.security.ratelimit import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_refill_with_exact_hint() -> None:
    clock = Clock()
    limiter = RateLimiter(10.0, burst=3, clock=clock)
    assert [limiter.acquire("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.acquire("a") == pytest.approx(0.1)  # one token per 100 ms
    clock.now += 0.1
    assert limiter.acquire("a") == 0.0
    assert limiter.acquire("b") == 0.0  # buckets are per client


def test_client_rate_override_scales_its_burst() -> None:
    clock = Clock()
    limiter = RateLimiter(1.0, burst=2, clock=clock)
    granted = sum(limiter.acquire("fast", rate=5.0) == 0.0 for _ in range(20))
    assert granted == 10  # burst 2 * 5 / 1
    assert limiter.acquire("fast", rate=5.0) == pytest.approx(0.2)


def test_default_burst_is_one_second() -> None:
    limiter = RateLimiter(2.5, clock=Clock())
    assert limiter.burst == 3


def test_buckets_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ratelimit, "MAX_BUCKETS", 4)
    limiter = RateLimiter(1.0, burst=1, clock=Clock())
    for i in range(10):
        limiter.acquire(f"peer{i}")
    assert len(limiter._buckets) == 4


@pytest.mark.parametrize(("rate", "burst"), [(0.0, None), (-1.0, None), (1.0, 0)])
def test_bad_limits(rate: float, burst: int | None) -> None:
    with pytest.raises(ValueError, match="rate|burst"):
        RateLimiter(rate, burst)
