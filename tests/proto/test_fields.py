"""A contract field keeps its name on the wire: which names each side of a pair lacks."""

from __future__ import annotations

import dataclasses

import pytest

from hopserve.client.results import ModelInfo
from hopserve.proto import contract
from hopserve.proto.fields import from_message, to_message
from hopserve.proto.v1 import embedding_pb2, worker_pb2

# (dataclass, message, fields only the dataclass has, fields only the message has)
PAIRS = [
    (contract.LayerStats, worker_pb2.LayerStats, set(), set()),
    (contract.RunStats, worker_pb2.JobStats, set(), set()),
    (contract.ModelStatus, worker_pb2.LoadedModel, set(), set()),
    (contract.BlockInfo, embedding_pb2.BlockInfo, set(), set()),
    (
        contract.WorkerStatus,
        worker_pb2.WorkerInfo,
        {"memory"},
        {"device_memory_used_bytes", "device_memory_total_bytes", "device_memory_peak_bytes"},
    ),
    (ModelInfo, embedding_pb2.ModelInfo, set(), set()),
]


@pytest.mark.parametrize(("cls", "message", "only_cls", "only_message"), PAIRS)
def test_names_match_except_the_known_ones(cls, message, only_cls, only_message) -> None:
    """A field added on one side only must be added to the other (or listed here)."""
    ours = {f.name for f in dataclasses.fields(cls)}
    wire = set(message.DESCRIPTOR.fields_by_name)
    assert (ours - wire, wire - ours) == (only_cls, only_message)


def test_round_trip_converts_containers_and_lets_given_win() -> None:
    stats = contract.RunStats(
        compute_s=1.5, frontier_sizes=[3, 2], tiers={"features": "host"}, device="cpu"
    )
    msg = to_message(stats, worker_pb2.JobStats, layers=[])
    back = from_message(msg, contract.RunStats, layers=[], device="given")
    assert back.frontier_sizes == [3, 2] and isinstance(back.frontier_sizes, list)
    assert back.tiers == {"features": "host"} and isinstance(back.tiers, dict)
    assert back.compute_s == 1.5 and back.device == "given"
