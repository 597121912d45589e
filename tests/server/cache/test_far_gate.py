"""The far-tier gate: open while the shared tier finds enough of the near misses, probing
1 lookup in ``probe_every`` while it does not."""

from __future__ import annotations

from hopserve.server.cache.far_gate import FarTierGate


def test_it_closes_below_the_rate_and_probes_while_closed() -> None:
    gate = FarTierGate(min_hit_rate=0.1, window=10, probe_every=4)
    assert gate.ask() and gate.record(6, 0) is None  # window not full yet
    assert gate.record(4, 0) is False and not gate.open  # 0 of 10 found: closed
    asked = [gate.ask() for _ in range(12)]
    assert asked == [False, False, False, True] * 3


def test_probes_that_find_rows_reopen_it() -> None:
    gate = FarTierGate(min_hit_rate=0.1, window=10, probe_every=2)
    gate.record(10, 0)
    assert not gate.open
    assert gate.record(10, 1) is True and gate.open  # 10% found: open again
    assert all(gate.ask() for _ in range(5))
    assert gate.record(10, 5) is None  # still open: no change to report


def test_a_rate_of_zero_always_asks() -> None:
    gate = FarTierGate(min_hit_rate=0.0, window=4)
    gate.record(4, 0)
    assert all(gate.ask() for _ in range(8))
