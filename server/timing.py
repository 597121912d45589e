"""Where a request's time went, stage by stage (``hopserve.v1.StageTiming``).

The stage names are the contract's (:data:`hopserve.proto.contract.STAGES`); this is the
front-end's one representation of them, from a batch's worker stats to a response.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hopserve.proto.contract import STAGES, RunStats
from hopserve.proto.v1 import embedding_pb2 as pb

__all__ = ["StageTimes"]


@dataclass
class StageTimes:
    """Seconds per stage (:data:`~hopserve.proto.contract.STAGES`) and per layer."""

    cache_lookup: float = 0.0
    queue_wait: float = 0.0
    planning: float = 0.0
    prepare: float = 0.0
    compute: float = 0.0
    transfer: float = 0.0
    write_back: float = 0.0  # the write-back runs after answering: 0 in responses
    layer_compute: list[float] = field(default_factory=list)  # layer 1 first

    @classmethod
    def of_batch(
        cls, stats: RunStats, *, planned_s: float, wall_s: float, num_layers: int, exact: bool
    ) -> StageTimes:
        """A batch's stages from its worker stats.

        Args:
            stats: The job's :class:`~hopserve.proto.contract.RunStats`.
            planned_s: Front-end planning of the batch (exact batches).
            wall_s: The dispatch round trip as the front-end measured it.
            num_layers: L (block 0, if reported, joins layer 1).
            exact: Exact batches were planned by the front-end; sampling ones by the worker.
        """
        per_block = stats.layer_compute_s
        layers = list(per_block)
        if len(per_block) == num_layers + 1 and per_block:  # block 0 joins layer 1
            layers = [per_block[0] + per_block[1], *per_block[2:]]
        return cls(
            planning=planned_s + (0.0 if exact else stats.planning_s),
            prepare=stats.prepare_s + (stats.planning_s if exact else 0.0),
            compute=stats.compute_s,
            # worker copies + layer write-outs + the dispatch round trip beyond the job
            transfer=stats.transfer_s + stats.write_out_s + max(0.0, wall_s - stats.total_s),
            layer_compute=layers,
        )

    def add(self, other: StageTimes) -> None:
        """Add ``other`` stage by stage (a request that rode in several batches)."""
        for stage in STAGES:
            setattr(self, stage, getattr(self, stage) + getattr(other, stage))
        extra = len(other.layer_compute) - len(self.layer_compute)
        self.layer_compute += [0.0] * max(0, extra)
        for i, seconds in enumerate(other.layer_compute):
            self.layer_compute[i] += seconds

    def to_proto(self, total: float) -> pb.StageTiming:
        """As a ``StageTiming`` with ``total`` seconds."""
        return pb.StageTiming(
            **{stage: getattr(self, stage) for stage in STAGES},
            total=total,
            layer_compute=self.layer_compute,
        )
