r"""Exact reuse of intermediate embeddings: layer-``l`` rows of hub nodes, kept between jobs.

A node's *layer-l state* is its row of every value that layer ``l`` (block ``l``) produces
and a later block reads. Boundary ``l`` (``1 <= l < L``) is *cacheable* when every value
crossing it was produced by block ``l`` (chain models: GCN, SAGE, GAT, GIN, …; a
jumping-knowledge model's boundaries are not, as layer 1's output crosses them all).

The cache keeps the states of the ``capacity`` nodes with the most in-edges: recomputing
one costs its whole in-neighbourhood at every layer below, and on a power-law graph
nearly every request's frontier runs into the same hubs. Each row carries the graph
sequence ``s`` it was computed at. For a job at sequence ``t`` the row of ``v`` is reused
iff

.. math:: \mathrm{stale}_l(v) \le s \le t

where :math:`\mathrm{stale}_l(v)` is the last sequence that could change ``v``'s layer-``l``
row (the living graph's invalidation rule at depth ``l``, :mod:`~hopserve.worker.graph.live.
invalidation`). The planner then stops the frontier there: a reused node's in-neighbours
are not needed at layer ``l - 1`` (:func:`~hopserve.worker.graph.planner.plan_frontiers`),
and the run writes the reused rows into layer ``l``'s output (:mod:`~.run`). Rows are
exact (the same function of the same inputs) up to the summation order of the batch that
computed them.

Not thread-safe: one job of a model runs at a time (the worker's per-model lock).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from hopserve.worker.engine.settings import DEFAULT_LAYER_CACHE_ROWS
from hopserve.worker.trace.blocks import ModelSplit

__all__ = ["DEFAULT_LAYER_CACHE_ROWS", "LayerCache", "LayerReuse", "cacheable_boundaries"]


def cacheable_boundaries(split: ModelSplit) -> dict[int, tuple[str, ...]]:
    """``{l: names of layer l's state}`` for every cacheable boundary ``1 <= l < L``."""
    producer = {name: b.index for b in split.blocks for name in b.outputs}
    out: dict[int, tuple[str, ...]] = {}
    for block in split.blocks:
        layer = block.index
        if not 1 <= layer < split.num_layers:
            continue
        crossing = [  # stored values (not the raw features) live past block `layer`
            name
            for name, last in split.last_use.items()
            if last > layer and name in producer and producer[name] <= layer
        ]
        if (
            crossing
            and all(producer[name] == layer for name in crossing)
            and split.output not in crossing
        ):
            out[layer] = tuple(crossing)
    return out


@dataclass
class LayerReuse:
    """What one run reuses and keeps (built by :meth:`LayerCache.reuse`).

    ``rows[l][name]`` holds the reused nodes' rows of value ``name``, aligned with the
    plan's ``layers[l].reused``; ``capture(l, nodes, computed, values)`` is called after
    block ``l`` ran (``nodes``: the layer's rows, ``None`` = all nodes; ``computed``: the
    rows it computed, ``None`` = all of ``nodes``; ``values``: name → stored tensor).
    """

    rows: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    capture: (
        Callable[[int, np.ndarray | None, np.ndarray | None, dict[str, Tensor]], None] | None
    ) = None
    reused: int = 0
    """Rows reused in this run, over all boundaries."""


class LayerCache:
    """Layer-``l`` states of the ``capacity`` nodes with the most in-edges, per boundary.

    Args:
        split: the model's split (decides the cacheable boundaries and state names).
        in_degrees: in-degree per storage node of the graph the hub set is chosen on.
        capacity: rows kept per boundary (``0``: nothing is cached).
        token: the graph's identity (storage order); :meth:`matches` tells a new one.
    """

    def __init__(
        self, split: ModelSplit, in_degrees: np.ndarray, capacity: int, token: object = None
    ) -> None:
        self.boundaries = cacheable_boundaries(split) if capacity > 0 else {}
        self.token = token
        n = int(in_degrees.size)
        k = min(int(capacity), n)
        if k and k < n:  # the k largest in-degrees; ties go to the lower id
            order = np.argsort(-np.asarray(in_degrees, dtype=np.int64), kind="stable")
            hubs = np.sort(order[:k])
        else:
            hubs = np.arange(k, dtype=np.int64)
        self.hubs = hubs.astype(np.int64)
        self.slot_of = np.full(n, -1, dtype=np.int64)
        self.slot_of[self.hubs] = np.arange(self.hubs.size)
        self._seq = {layer: np.full(self.hubs.size, -1, np.int64) for layer in self.boundaries}
        self._values: dict[int, dict[str, Tensor]] = {layer: {} for layer in self.boundaries}
        # Validity at one sequence, kept between jobs: stale marks move only when the
        # sequence does, so it changes only by the rows kept since (see _keep).
        self._valid: dict[int, tuple[int, np.ndarray]] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.boundaries) and self.hubs.size > 0

    def matches(self, token: object) -> bool:
        """Whether the cache was built for the graph ``token`` names."""
        return token == self.token

    def slots(self, nodes: np.ndarray) -> np.ndarray:
        """Slot of each storage node (``-1``: not a hub, or added after the hub set)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        out = np.full(nodes.shape, -1, dtype=np.int64)
        known = nodes < self.slot_of.size
        out[known] = self.slot_of[nodes[known]]
        return out

    def rows_kept(self) -> int:
        """Rows holding a state, over all boundaries."""
        return int(sum(int((s >= 0).sum()) for s in self._seq.values()))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for v in self._values.values() for t in v.values())

    # ------------------------------------------------------------------ one run
    def reusable(
        self, seq: int, stale_since: Callable[[int, np.ndarray], np.ndarray], num_nodes: int
    ) -> dict[int, np.ndarray]:
        """Per boundary, a mask ``[num_nodes]`` of the nodes whose cached state is valid at
        sequence ``seq`` (``stale_since(l, hubs)``: the last sequence that could change
        each hub's layer-``l`` row). Boundaries with nothing valid are left out.

        ``seq`` must be the graph's current sequence (marks are only set up to it): the
        masks are then kept and reused until it moves (a mask is shared: do not modify).
        """
        out = {}
        for layer, kept in self._seq.items():
            memo = self._valid.get(layer)
            if memo is not None and memo[0] == seq and memo[1].size == num_nodes:
                mask = memo[1]
            else:
                filled = kept >= 0
                if not filled.any():
                    continue
                valid = filled & (kept <= seq) & (kept >= stale_since(layer, self.hubs))
                nodes = self.hubs[valid]
                mask = np.zeros(num_nodes, dtype=bool)
                mask[nodes[nodes < num_nodes]] = True
                self._valid[layer] = (seq, mask)
            if mask.any():
                out[layer] = mask
        return out

    def reuse(self, reused: dict[int, np.ndarray], seq: int) -> LayerReuse:
        """The rows of ``reused[l]`` (sorted storage ids, all valid) for one run, and a
        capture hook that keeps the hub rows the run computes, tagged ``seq``."""
        rows = {}
        total = 0
        for layer, nodes in reused.items():
            if nodes is None or nodes.size == 0:
                continue
            index = torch.from_numpy(self.slots(nodes))
            rows[layer] = {
                name: t.index_select(0, index) for name, t in self._values[layer].items()
            }
            total += int(nodes.size)

        def capture(layer, nodes, computed, values):  # noqa: ANN001 - LayerReuse.capture
            self._keep(layer, nodes, computed, values, seq)

        return LayerReuse(rows, capture, total)

    def _keep(
        self,
        layer: int,
        nodes: np.ndarray | None,
        computed: np.ndarray | None,
        values: dict[str, Tensor],
        seq: int,
    ) -> None:
        """Store the hub rows among ``computed`` (positions within ``nodes``)."""
        if layer not in self.boundaries:
            return
        names = self.boundaries[layer]
        if any(name not in values for name in names):
            return
        done = computed if computed is not None else nodes
        if done is None:  # every node computed: every hub, at its storage position
            hubs = self.hubs[self.hubs < next(iter(values.values())).shape[0]]
        else:
            hubs = done[self.slots(done) >= 0]
        if hubs.size == 0:
            return
        slots = self.slots(hubs)
        kept = self._seq[layer]
        newer = kept[slots] <= seq  # never replace a row computed at a later sequence
        hubs, slots = hubs[newer], slots[newer]
        if hubs.size == 0:
            return
        positions = hubs if nodes is None else np.searchsorted(nodes, hubs)
        index = torch.from_numpy(positions)
        store = self._values[layer]
        for name in names:
            src = values[name]
            rows = src.index_select(0, index.to(src.device)).to("cpu")
            table = store.get(name)
            if table is None:
                table = torch.zeros((self.hubs.size, *rows.shape[1:]), dtype=rows.dtype)
                store[name] = table
            table.index_copy_(0, torch.from_numpy(slots), rows)
        kept[slots] = seq
        memo = self._valid.get(layer)
        if memo is not None and memo[0] == seq:  # computed at the memo's sequence: valid
            memo[1][hubs[hubs < memo[1].size]] = True
